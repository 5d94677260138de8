//! `npuctl fleet`: the hosts of `--fleet` (or `NPUD_FLEET`), their health and load, and which
//! one the next session would go to. Exits 1 when no host serves.

use npu_client::json::{fleet_json, host_health};
use npu_client::{Fleet, HostHealth, HostStatus};

use crate::output::{self, table};

pub async fn run(fleet: Option<&str>, json: bool) -> crate::CmdResult {
    let Some(spec) = fleet else {
        return Err(
            "npuctl fleet needs --fleet ADDR,ADDR,... or dns:///NAME:PORT \
                    (or NPUD_FLEET)"
                .into(),
        );
    };
    let fleet = crate::fleet(spec).await?;
    let hosts = fleet.hosts();
    if json {
        output::print_json(&fleet_json(&fleet));
    } else {
        print_table(&fleet, &hosts);
    }
    if hosts.iter().any(|h| h.health == HostHealth::Serving) {
        Ok(())
    } else {
        Err(format!("no host of {} serves", fleet.spec()))
    }
}

fn print_table(fleet: &Fleet, hosts: &[HostStatus]) {
    println!("fleet {} ({} hosts)", fleet.spec(), hosts.len());
    if let Some(e) = fleet.resolve_error() {
        println!("last resolution failed: {e}");
    }
    let mut t = table(&["host", "health", "sessions", "pending", "next"]);
    for h in hosts {
        let (word, reason) = host_health(&h.health);
        let health = match (reason, h.retry_in) {
            (Some(why), Some(r)) => format!("{word}: {why} (retry in {r:.1?})"),
            (Some(why), None) => format!("{word}: {why}"),
            (None, _) => word.to_owned(),
        };
        t.add_row(vec![
            h.address.to_string(),
            health,
            h.sessions.to_string(),
            h.pending_dispatches.to_string(),
            if h.next { "<- next" } else { "" }.to_owned(),
        ]);
    }
    println!("{t}");
}
