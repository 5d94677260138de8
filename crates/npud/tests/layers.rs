//! npud's modules form layers: no module reaches, through the modules it uses, back to
//! itself. The error type and the configuration sit below the policy, the policy below the
//! transport (`conn`, `accept`, `tls`, `codes`, `lives`, `intake`, `fdsock`), and `service`
//! below `fdsock` and beside `metrics`, never under them.
//!
//! A module's uses are the `crate::<module>` paths in its code (comments and `#[cfg(test)]`
//! modules left out, since tests may reach anywhere).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level module a source file belongs to (`service/ring.rs` → `service`).
fn top_module(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// The code of a file without comments and without its `#[cfg(test)]` modules (from the first
/// one on: they close the files here).
fn code_of(text: &str) -> String {
    let cut = text.find("#[cfg(test)]\nmod ").unwrap_or(text.len());
    text[..cut]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module names `code` uses through `crate::`: `crate::a::x`, `crate::a`, and each path
/// of a `use crate::{a, b::c}` group.
fn uses(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find("};").unwrap_or(group.len())];
            // Paths at the group's top level: after `{` or a `,` at depth 0.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if c.is_whitespace() => {}
                    _ if start && depth == 0 => {
                        out.insert(ident(&group[j..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("src is readable") {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(&src).expect("under src");
            let Some(m) = top_module(rel) else { continue };
            let text = std::fs::read_to_string(&p).expect("a source file");
            let used = uses(&code_of(&text));
            g.entry(m.clone()).or_default().extend(used);
        }
    }
    let names: BTreeSet<String> = g.keys().cloned().collect();
    for (m, used) in &mut g {
        used.retain(|u| names.contains(u) && u != m);
    }
    g
}

/// A circle through `from`, as the path of modules that closes it, if there is one.
fn circle_from(g: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    // Depth-first with the path kept: small graph (some 40 modules).
    fn walk(
        g: &BTreeMap<String, BTreeSet<String>>,
        target: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in g.get(at).into_iter().flatten() {
            if next == target {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(g, target, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![from.to_owned()];
    let mut seen = BTreeSet::new();
    walk(g, from, from, &mut path, &mut seen).then_some(path)
}

#[test]
fn npud_s_modules_form_layers() {
    let g = graph();
    assert!(g.len() > 20, "found only {} modules in src", g.len());
    let circles: Vec<String> = g
        .keys()
        .filter_map(|m| circle_from(&g, m))
        .map(|c| c.join(" -> "))
        .collect();
    assert!(
        circles.is_empty(),
        "modules that reach back to themselves:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_check_sees_a_circle_and_each_form_of_use() {
    let used = uses("use crate::{a, b::{c, d}, e::f};\nfn x() { crate::g::h(); }\n// crate::z\n");
    assert_eq!(
        used,
        ["a", "b", "e", "g", "z"]
            .map(String::from)
            .into_iter()
            .collect(),
        "code_of drops comments, not uses"
    );
    assert!(!uses(&code_of("// crate::z\nfn y() {}\n")).contains("z"));
    let mut g = BTreeMap::new();
    g.insert("error".to_owned(), BTreeSet::from(["conn".to_owned()]));
    g.insert("conn".to_owned(), BTreeSet::from(["error".to_owned()]));
    g.insert("config".to_owned(), BTreeSet::new());
    assert_eq!(
        circle_from(&g, "error"),
        Some(vec![
            "error".to_owned(),
            "conn".to_owned(),
            "error".to_owned()
        ])
    );
    assert_eq!(circle_from(&g, "config"), None);
}
