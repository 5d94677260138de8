//! Tables, JSON renderings of the daemon's messages, and units.

use comfy_table::{ContentArrangement, Table, presets};
use npu_client::proto as pb;
use serde_json::Value;

pub use npu_client::json::*;

/// A table with npuctl's look.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().copied());
    t
}

/// Names and values, one pair a line, the values aligned. On a terminal long values wrap to
/// its width; elsewhere (a pipe, a file, a log) each line is as long as its text, never padded.
pub fn kv_table(rows: Vec<(&str, String)>) -> String {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        let mut t = Table::new();
        t.load_preset(presets::NOTHING)
            .set_content_arrangement(ContentArrangement::Dynamic);
        for (k, v) in rows {
            t.add_row(vec![format!("{k}:"), v]);
        }
        return t
            .to_string()
            .lines()
            .map(str::trim_end)
            .collect::<Vec<_>>()
            .join("\n");
    }
    plain_rows(&rows)
}

/// `name:` padded to the longest name, then the value; no trailing blanks.
fn plain_rows(rows: &[(&str, String)]) -> String {
    let width = rows
        .iter()
        .map(|(k, _)| k.chars().count() + 1)
        .max()
        .unwrap_or(0);
    rows.iter()
        .map(|(k, v)| {
            format!("{:<width$} {v}", format!("{k}:"))
                .trim_end()
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Prints a value as pretty JSON.
pub fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    );
}

/// Bytes for people: `4.0 KiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Nanoseconds for people.
pub fn ns(n: u64) -> String {
    format!("{:?}", std::time::Duration::from_nanos(n))
}

/// Mean of a duration counter, for people.
pub fn mean(d: Option<&pb::Duration>) -> String {
    match d {
        Some(d) if d.count > 0 => ns(d.ns / d.count),
        _ => "-".into(),
    }
}

pub fn count(d: Option<&pb::Duration>) -> u64 {
    d.map_or(0, |d| d.count)
}

/// Dispatch totals over every program.
pub fn totals(s: &pb::Statistics) -> (u64, u64, u64, u64) {
    let mut t = (0, 0, 0, 0);
    for p in &s.programs {
        if let Some(d) = &p.dispatches {
            t.0 += count(d.success.as_ref());
            t.1 += count(d.fail.as_ref());
            t.2 += d.queue.as_ref().map_or(0, |x| x.ns);
            t.3 += d.execute.as_ref().map_or(0, |x| x.ns);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_rows_align_values_and_pad_nothing_at_the_end() {
        let s = plain_rows(&[
            ("device", "npu2".into()),
            ("you are", "uid:0".into()),
            ("x", String::new()),
        ]);
        assert_eq!(s, "device:  npu2\nyou are: uid:0\nx:");
    }
}
