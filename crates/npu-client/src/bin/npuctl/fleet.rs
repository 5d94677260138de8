//! `npuctl fleet`: the hosts of `--fleet` (or `NPUD_FLEET`), their health and load, and which
//! one the next session would go to. Exits 1 when no host serves.

use npu_client::{Fleet, HostHealth, HostStatus};
use serde_json::{Value, json};

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
        output::print_json(&fleet_json(&fleet, &hosts));
    } else {
        print_table(&fleet, &hosts);
    }
    if hosts.iter().any(|h| h.health == HostHealth::Serving) {
        Ok(())
    } else {
        Err(format!("no host of {} serves", fleet.spec()))
    }
}

/// The health word and its reason.
fn health(h: &HostHealth) -> (&'static str, Option<&str>) {
    match h {
        HostHealth::Unknown => ("unknown", None),
        HostHealth::Serving => ("serving", None),
        HostHealth::NotServing(why) => ("not_serving", Some(why)),
        HostHealth::Down(why) => ("down", Some(why)),
    }
}

fn ms(d: Option<std::time::Duration>) -> Value {
    d.map_or(Value::Null, |d| {
        json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    })
}

fn fleet_json(fleet: &Fleet, hosts: &[HostStatus]) -> Value {
    json!({
        "fleet": fleet.spec().to_string(),
        "resolve_error": fleet.resolve_error(),
        "next": hosts.iter().find(|h| h.next).map(|h| h.address.to_string()),
        "hosts": hosts.iter().map(|h| {
            let (word, reason) = health(&h.health);
            json!({
                "address": h.address.to_string(),
                "health": word,
                "reason": reason,
                "sessions": h.sessions,
                "pending_dispatches": h.pending_dispatches,
                "next": h.next,
                "checked_ms_ago": ms(h.checked_ago),
                "retry_in_ms": ms(h.retry_in),
            })
        }).collect::<Vec<_>>(),
    })
}

fn print_table(fleet: &Fleet, hosts: &[HostStatus]) {
    println!("fleet {} ({} hosts)", fleet.spec(), hosts.len());
    if let Some(e) = fleet.resolve_error() {
        println!("last resolution failed: {e}");
    }
    let mut t = table(&["host", "health", "sessions", "pending", "next"]);
    for h in hosts {
        let (word, reason) = health(&h.health);
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
