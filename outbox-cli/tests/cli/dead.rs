//! Dead letters: listing either way, showing one, requeueing and discarding by id and
//! by filter, and unknown ids.

use std::time::Duration;

use base64::Engine as _;
use outbox_core::{store::ClaimIds, DeadLetterFilter, MessageId};

use crate::common::{cells, Fixture};

pub(crate) async fn dead_list_pages_either_way_and_filters(f: &Fixture) {
    let seed = f.seed().await;
    let run = f.run(&["dead", "list", "--limit", "2"]);
    run.expect(0);
    let rows = cells(&run.stdout);
    assert_eq!(rows[0][..3], ["ID", "DESTINATION", "ATTEMPTS"]);
    assert_eq!(rows[1][0], seed.dead[0].to_string());
    assert_eq!(rows[2][0], seed.dead[1].to_string());
    assert!(
        run.stdout.contains(&format!(
            "2 of 5 dead letters (oldest first); next page: --after {}",
            seed.dead[1]
        )),
        "{}",
        run.stdout
    );
    assert!(
        !run.stdout.contains('\u{1b}'),
        "errors are made safe to print"
    );

    // Every page, by JSON, both ways.
    for (flag, expected) in [
        ("--oldest-first", seed.dead.clone()),
        ("--newest-first", {
            let mut down = seed.dead.clone();
            down.reverse();
            down
        }),
    ] {
        let mut ids: Vec<MessageId> = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut args = vec!["dead", "list", "--limit", "2", "--json"];
            if flag == "--newest-first" {
                args.push(flag);
            }
            if let Some(after) = &after {
                args.extend(["--after", after.as_str()]);
            }
            let page = f.run(&args).expect(0).json();
            assert_eq!(page["total"], 5);
            for letter in page["dead_letters"].as_array().unwrap() {
                ids.push(letter["id"].as_str().unwrap().parse().unwrap());
                assert_eq!(letter["attempts"], 1);
                assert!(
                    letter.get("payload_base64").is_none(),
                    "lists carry no payload"
                );
            }
            match page["next_after"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => break,
            }
        }
        assert_eq!(ids, expected, "{flag}");
    }

    let payments = f
        .run(&["dead", "list", "--destination", "payments", "--json"])
        .expect(0)
        .json();
    assert_eq!(payments["total"], 2);
    let destinations: Vec<&str> = payments["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["destination"].as_str().unwrap())
        .collect();
    assert_eq!(destinations, ["payments", "payments"]);
    let old = f
        .run(&["dead", "list", "--dead-for", "1h"])
        .expect(0)
        .stdout
        .clone();
    assert!(
        old.starts_with("0 dead letters dead for at least 1h in "),
        "{old}"
    );
    seed.check(&f.stats().await);
}

pub(crate) async fn dead_show_prints_one_dead_letter(f: &Fixture) {
    let seed = f.seed().await;
    let id = seed.orders[0].to_string();
    let run = f.run(&["dead", "show", &id]);
    run.expect(0);
    for expected in [
        format!("id             {id}"),
        "destination    orders".to_owned(),
        "content type   application/json".to_owned(),
        "attempts       1".to_owned(),
        "last error     broker rejected: schema validation failed".to_owned(),
        "  trace-id  trace-".to_owned(),
        "payload        7 bytes, UTF-8 text".to_owned(),
        "  {\"n\":".to_owned(),
    ] {
        assert!(
            run.stdout.contains(&expected),
            "{expected:?} in\n{}",
            run.stdout
        );
    }
    let json = f.run(&["dead", "show", &id, "--json"]).expect(0).json();
    assert_eq!(json["id"], id.as_str());
    assert_eq!(json["destination"], "orders");
    assert!(json["payload_text"]
        .as_str()
        .unwrap()
        .starts_with("{\"n\":"));
    assert!(json["headers"]["trace-id"]
        .as_str()
        .unwrap()
        .starts_with("trace-"));

    let binary = seed.binary.to_string();
    let run = f.run(&["dead", "show", &binary]);
    run.expect(0);
    assert!(
        run.stdout.contains("payload        5 bytes, binary"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("  00000000  00 9f 92 96 ff"),
        "{}",
        run.stdout
    );
    let json = f.run(&["dead", "show", &binary, "--json"]).expect(0).json();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(json["payload_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(bytes, [0x00, 0x9f, 0x92, 0x96, 0xff]);
    assert!(json.get("payload_text").is_none());

    let escaped = f.run(&["dead", "show", &seed.text_payment.to_string()]);
    escaped.expect(0);
    assert!(
        !escaped.stdout.contains('\u{1b}'),
        "no raw escape reaches the terminal"
    );
    assert!(
        escaped.stdout.contains("publish timed out\\u{1b}[2J"),
        "{}",
        escaped.stdout
    );
    seed.check(&f.stats().await);
}

pub(crate) async fn unknown_ids_fail_and_change_nothing(f: &Fixture) {
    let seed = f.seed().await;
    let unknown = MessageId::new().to_string();
    let run = f.run(&["dead", "show", &unknown]);
    run.expect(1);
    assert!(run.stdout.is_empty());
    assert!(
        run.stderr
            .starts_with(&format!("error: no dead letter with id {unknown} in ")),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("hint: "), "{}", run.stderr);

    // A message that is not dead is not a dead letter either.
    let known = seed.orders[0].to_string();
    for (verb, live) in [("requeue", seed.pending), ("discard", seed.in_flight)] {
        let live = live.to_string();
        let run = f.run(&["dead", verb, &known, &live, "--yes"]);
        run.expect(1);
        assert!(
            run.stderr
                .contains(&format!("{live} (1 of the 2 ids) is not a dead letter")),
            "{}",
            run.stderr
        );
        assert!(run.stderr.contains("nothing was"), "{}", run.stderr);
    }
    let run = f.run(&["dead", "requeue", "not-an-id", "--yes"]);
    run.expect(2);
    assert!(run.stderr.contains("is not a message id"), "{}", run.stderr);
    seed.check(&f.stats().await);
}

pub(crate) async fn requeue_by_id_asks_first(f: &Fixture) {
    let seed = f.seed().await;
    let id = seed.orders[1].to_string();
    // No answer (a script's closed stdin) and a "no" both decline.
    for input in [None, Some("n\n")] {
        let run = f.run_with_input(&["dead", "requeue", &id], input);
        run.expect(1);
        assert!(run.stderr.contains("[y/N]"), "{}", run.stderr);
        assert!(
            run.stderr.contains(&id),
            "the question shows what it is about"
        );
        assert!(
            run.stderr
                .contains("error: not confirmed; nothing was requeued"),
            "{}",
            run.stderr
        );
        seed.check(&f.stats().await);
    }
    let run = f.run_with_input(&["dead", "requeue", &id], Some("y\n"));
    run.expect(0);
    assert_eq!(run.stdout.trim(), "requeued 1 dead letter");
    let stats = f.stats().await;
    assert_eq!((stats.pending, stats.dead), (2, 4));
    // Due at once, attempts reset: the next claim is its first again.
    let claim = ClaimIds::new(&[seed.orders[1]], Duration::from_secs(60)).unwrap();
    let claimed = f.store().claim_ids(&claim).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].message.attempts, 1);

    let two = [seed.orders[0].to_string(), seed.orders[2].to_string()];
    let json = f
        .run(&["dead", "requeue", &two[0], &two[1], "--yes", "--json"])
        .expect(0)
        .json();
    assert_eq!(
        json,
        serde_json::json!({"action": "requeued", "matched": 2, "changed": 2})
    );
    let orders = DeadLetterFilter::default()
        .with_destination("orders")
        .unwrap();
    assert_eq!(f.dead_count(orders).await, 0);
}

pub(crate) async fn requeue_all_for_a_destination_goes_in_batches(f: &Fixture) {
    let seed = f.seed().await;
    let declined = f.run(&["dead", "requeue", "--all", "--destination", "payments"]);
    declined.expect(1);
    assert!(
        declined
            .stderr
            .contains("all 2 dead letters for destination payments"),
        "{}",
        declined.stderr
    );
    seed.check(&f.stats().await);

    let run = f.run(&[
        "dead",
        "requeue",
        "--all",
        "--destination",
        "payments",
        "--batch",
        "1",
        "--yes",
    ]);
    run.expect(0);
    assert_eq!(run.stdout.trim(), "requeued 2 dead letters");
    assert_eq!(
        run.stderr.lines().collect::<Vec<_>>(),
        ["requeued 1 of 2"],
        "progress per batch"
    );
    let payments = DeadLetterFilter::default()
        .with_destination("payments")
        .unwrap();
    assert_eq!(f.dead_count(payments).await, 0);
    let stats = f.stats().await;
    assert_eq!((stats.pending, stats.dead), (3, 3), "orders stay dead");

    let nothing = f
        .run(&[
            "dead",
            "requeue",
            "--all",
            "--destination",
            "payments",
            "--json",
        ])
        .expect(0)
        .json();
    assert_eq!(nothing["matched"], 0, "nothing to ask about");
    let bad = f.run(&["dead", "requeue", "--all", "--destination", "", "--yes"]);
    bad.expect(2);
    assert!(bad.stderr.contains("--destination"), "{}", bad.stderr);
}

pub(crate) async fn discard_by_id_and_all(f: &Fixture) {
    let seed = f.seed().await;
    let one = seed.payments[0].to_string();
    let run = f.run(&["dead", "discard", &one, "--yes"]);
    run.expect(0);
    assert_eq!(run.stdout.trim(), "discarded 1 dead letter");
    assert_eq!(f.stats().await.dead, 4);
    let gone = f.run(&["dead", "show", &one]);
    gone.expect(1);

    let run = f.run_with_input(&["dead", "discard", "--all"], Some("yes\n"));
    run.expect(0);
    assert!(
        run.stderr
            .contains("Discard (delete for good) all 4 dead letters in "),
        "{}",
        run.stderr
    );
    assert_eq!(run.stdout.trim(), "discarded 4 dead letters");
    let stats = f.stats().await;
    assert_eq!(
        (stats.pending, stats.in_flight, stats.dead, stats.dispatched),
        (1, 1, 0, 2),
        "only dead letters go"
    );
}
