//! `serve`'s `GET /metrics`: the facade's Prometheus text, process gauges sampled at each scrape.
//! The exporter renders from hash maps, so [`render`] sorts families by name and a counter's or
//! gauge's series; a histogram's lines stay as rendered (its buckets must stay in `le` order).

use metrics_exporter_prometheus::PrometheusHandle;

use super::catalogue::{PROCESS_OPEN_FDS, PROCESS_RSS};

/// The scrape's text: the process gauges sampled, then every family rendered, in name order.
pub fn render(handle: &PrometheusHandle) -> String {
    sample_process();
    sorted(&handle.render())
}

/// Sets [`PROCESS_RSS`] and [`PROCESS_OPEN_FDS`] from `/proc/self` (Linux only); the names are
/// Prometheus's own process collectors', so stock dashboards find them.
fn sample_process() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let vm_rss = status.lines().find_map(|l| l.strip_prefix("VmRSS:"));
    if let Some(kib) = vm_rss.and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok()) {
        metrics::gauge!(PROCESS_RSS).set((kib * 1024) as f64);
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        metrics::gauge!(PROCESS_OPEN_FDS).set(fds.count() as f64);
    }
}

/// Families (blocks ended by a blank line) sorted by name, and each counter's or gauge's series.
fn sorted(text: &str) -> String {
    let mut families: Vec<(String, Vec<&str>)> = text
        .split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut lines: Vec<&str> = block.lines().collect();
            let comments = block.lines().take_while(|l| l.starts_with('#')).count();
            let (header, series) = lines.split_at_mut(comments);
            let one_line = header.iter().any(|l| {
                l.starts_with("# TYPE ") && (l.ends_with(" counter") || l.ends_with(" gauge"))
            });
            if one_line {
                series.sort_unstable();
            }
            (family_name(block), lines)
        })
        .collect();
    families.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::with_capacity(text.len());
    for (_, lines) in families {
        for line in lines {
            out.push_str(line);
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

/// A block's family: the name its `# TYPE` (or first) line names.
fn family_name(block: &str) -> String {
    let first = block.lines().next().unwrap_or("");
    let name = match first.strip_prefix("# ") {
        Some(comment) => comment.split_whitespace().nth(1),
        None => first.split(['{', ' ']).next(),
    };
    name.unwrap_or("").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Families come out by name, a counter's series sorted, a histogram's lines as they were.
    #[test]
    fn families_in_name_order() {
        let text = "# TYPE b counter\nb{scope=\"tid\"} 1\nb{scope=\"ip\"} 2\n\n\
                    # HELP a_ms delay\n# TYPE a_ms histogram\na_ms_bucket{le=\"5\"} 1\n\
                    a_ms_bucket{le=\"10\"} 1\na_ms_sum 3\na_ms_count 1\n\n";
        assert_eq!(
            sorted(text),
            "# HELP a_ms delay\n# TYPE a_ms histogram\na_ms_bucket{le=\"5\"} 1\n\
             a_ms_bucket{le=\"10\"} 1\na_ms_sum 3\na_ms_count 1\n\n\
             # TYPE b counter\nb{scope=\"ip\"} 2\nb{scope=\"tid\"} 1\n\n"
        );
        assert_eq!(sorted(&sorted(text)), sorted(text), "stable");
    }
}
