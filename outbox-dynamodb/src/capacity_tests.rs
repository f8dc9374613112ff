//! Every request the outbox store sends asks DynamoDB for the capacity it consumed, so
//! [`OutboxMetrics`](crate::OutboxMetrics) counts all of it: a source scan of the
//! store's files for request chains (`.client.<operation>()` up to its `.send()`)
//! without `return_consumed_capacity`. The dedup, entity and lock stores keep no
//! capacity counters and are not scanned.

/// The outbox store's files, by name.
const OUTBOX_FILES: [(&str, &str); 12] = [
    ("admin.rs", include_str!("admin.rs")),
    ("dead_letter.rs", include_str!("dead_letter.rs")),
    ("body.rs", include_str!("body.rs")),
    ("claim.rs", include_str!("claim.rs")),
    ("complete.rs", include_str!("complete.rs")),
    ("enqueue.rs", include_str!("enqueue.rs")),
    ("markers.rs", include_str!("markers.rs")),
    ("meta.rs", include_str!("meta.rs")),
    ("settle.rs", include_str!("settle.rs")),
    ("shards.rs", include_str!("shards.rs")),
    ("store.rs", include_str!("store.rs")),
    ("sweep.rs", include_str!("sweep.rs")),
];

/// `file:line operation` of each request chain in `source` that does not ask for its
/// consumed capacity.
fn uncounted(file: &str, source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = source[from..].find(".client") {
        let start = from + at;
        from = start + ".client".len();
        let rest = source[from..].trim_start();
        let Some(rest) = rest.strip_prefix('.') else {
            continue;
        };
        let operation: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !rest[operation.len()..].starts_with("()") || operation == "clone" {
            continue;
        }
        let end = source[start..]
            .find(".send()")
            .map_or(source.len(), |e| start + e);
        if !source[start..end].contains("return_consumed_capacity") {
            let line = source[..start].matches('\n').count() + 1;
            out.push(format!("{file}:{line} {operation}"));
        }
    }
    out
}

#[test]
fn every_outbox_request_asks_for_its_consumed_capacity() {
    let missing: Vec<String> = OUTBOX_FILES
        .iter()
        .flat_map(|(file, source)| uncounted(file, source))
        .collect();
    assert!(missing.is_empty(), "requests not counted: {missing:?}");
}

#[test]
fn the_scan_sees_a_request_without_it() {
    let source = "let x = self\n    .inner\n    .client\n    .delete_item()\n    .key(k)\n    .send()\n    .await;\nlet y = self.inner.client.get_item().return_consumed_capacity(T).send();";
    assert_eq!(uncounted("f.rs", source), vec!["f.rs:3 delete_item"]);
    assert!(uncounted("f.rs", "self.inner.client.clone()").is_empty());
}
