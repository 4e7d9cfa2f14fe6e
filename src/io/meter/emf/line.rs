//! One EMF document as text.

use std::sync::Arc;

use super::{Doc, Emf, Series, TRACE_ID, Value};

/// Room for a line's members after its directive: enough for the gate's longest line.
const MEMBERS_ROOM: usize = 384;

impl Emf {
    /// One document: the directive under `_aws`, each dimension once, each metric, then `doc`'s
    /// properties. Every name and text is our own ASCII, so nothing needs escaping.
    pub(super) fn render(&self, line: &[(Arc<Series>, Value)], doc: Doc<'_>) -> String {
        let directive = self.directive(line);
        let mut out = String::with_capacity(directive.len() + MEMBERS_ROOM);
        let mut digits = itoa::Buffer::new();
        out.push_str(r#"{"_aws":{"Timestamp":"#);
        out.push_str(digits.format(doc.at));
        for piece in [r#","CloudWatchMetrics":"#, &directive, "}"] {
            out.push_str(piece);
        }
        for (i, (series, _)) in line.iter().enumerate() {
            for (name, value) in &series.dimensions {
                let earlier = line[..i].iter().flat_map(|(s, _)| &s.dimensions);
                if !earlier.clone().any(|(n, _)| n == name) {
                    text(&mut out, name, value);
                }
            }
        }
        for (series, value) in line {
            member(&mut out, series.key.name());
            match *value {
                Value::Count(n) => out.push_str(digits.format(n)),
                // An integral sample as an integer, as CloudWatch reads it.
                Value::Sample(v) if v.fract() == 0.0 && v.abs() < 9e15 => {
                    out.push_str(digits.format(v as i64));
                }
                Value::Sample(v) if v.is_finite() => out.push_str(&v.to_string()),
                Value::Sample(_) => out.push('0'),
            }
        }
        for (name, value) in doc.properties.iter().filter(|(n, _)| !n.is_empty()) {
            text(&mut out, name, value);
        }
        if let Some(id) = doc.trace {
            text(&mut out, TRACE_ID, id.hex().as_str());
        }
        out.push('}');
        out
    }

    /// The `CloudWatchMetrics` member of a line of these series, built once per kind of line.
    fn directive(&self, line: &[(Arc<Series>, Value)]) -> Arc<str> {
        // The key on the stack: a line has a few series (a longer one is built each time).
        let mut key = [0usize; 32];
        let Some(ids) = key.get_mut(..line.len()) else {
            return directive(&self.0.namespace, line).into();
        };
        ids.iter_mut().zip(line).for_each(|(id, (s, _))| *id = s.id);
        let ids: &[usize] = ids;
        let known = self.0.directives.read().unwrap_or_else(|e| e.into_inner());
        if let Some(directive) = known.get(ids) {
            return directive.clone();
        }
        drop(known);
        let built: Arc<str> = directive(&self.0.namespace, line).into();
        let mut known = self.0.directives.write().unwrap_or_else(|e| e.into_inner());
        known.insert(ids.to_vec(), built.clone());
        built
    }
}

/// The directive: the series' label sets as dimension sets, in order, each metric with its unit.
fn directive(namespace: &str, line: &[(Arc<Series>, Value)]) -> String {
    let mut sets: Vec<Vec<&str>> = Vec::new();
    for (series, _) in line {
        let set: Vec<&str> = series.dimensions.iter().map(|(n, _)| n.as_str()).collect();
        if !sets.contains(&set) {
            sets.push(set);
        }
    }
    let metrics: Vec<serde_json::Value> = line
        .iter()
        .map(|(s, _)| serde_json::json!({"Name": s.key.name(), "Unit": s.unit}))
        .collect();
    serde_json::json!([{"Namespace": namespace, "Dimensions": sets, "Metrics": metrics}])
        .to_string()
}

/// `,"<name>":`
fn member(out: &mut String, name: &str) {
    for piece in [r#",""#, name, r#"":"#] {
        out.push_str(piece);
    }
}

/// `,"<name>":"<value>"`
fn text(out: &mut String, name: &str, value: &str) {
    member(out, name);
    for piece in ["\"", value, "\""] {
        out.push_str(piece);
    }
}
