//! The plans the rules make, checked without a request.

use serde_json::Value;

use super::plan::{Action, Planned};
use super::*;

fn planned(rule: &Rule, body: &str) -> Planned {
    Planned::new(rule, body, &mut fastrand::Rng::with_seed(1)).expect("a plan")
}

#[test]
fn throttles_name_the_table_or_index_and_the_kind_of_capacity() {
    let rule = Rule::throttle("Query", Fault::ProvisionedThroughputExceeded);
    let Action::Answer { status, body, .. } =
        planned(&rule, r#"{"TableName":"t","IndexName":"due"}"#).action
    else {
        panic!("an answer");
    };
    assert_eq!(status, 400);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["__type"],
        "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"
    );
    assert_eq!(
        body["ThrottlingReasons"][0]["reason"],
        "IndexReadProvisionedThroughputExceeded"
    );
    let rule = Rule::throttle("UpdateItem", Fault::Throttling);
    let Action::Answer { body, .. } = planned(&rule, r#"{"TableName":"t"}"#).action else {
        panic!("an answer");
    };
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["throttlingReasons"][0]["reason"],
        "TableWriteAccountLimitExceeded"
    );
}

#[test]
fn a_cancelled_transaction_names_the_matching_action() {
    let rule = Rule::cancel_transaction(CancelReason::TransactionConflict).matching("m#second");
    let body = r#"{"TransactItems":[{"Put":{"Item":{"pk":{"S":"m#first"}}}},{"Put":{"Item":{"pk":{"S":"m#second"}}}}]}"#;
    let Action::Answer { body, .. } = planned(&rule, body).action else {
        panic!("an answer");
    };
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["CancellationReasons"][0]["Code"], "None");
    assert_eq!(
        body["CancellationReasons"][1]["Code"],
        "TransactionConflict"
    );
}

#[test]
fn rules_apply_to_their_operation_at_their_rate_and_count() {
    let faults = FaultInjector::new(42);
    faults.add(Rule::throttle("UpdateItem", Fault::Throttling).times(2));
    faults.add(Rule::throttle("Query", Fault::Throttling).rate(0.0));
    for _ in 0..5 {
        faults.draw("UpdateItem", b"{}");
        faults.draw("Query", b"{}");
        faults.draw("GetItem", b"{}");
    }
    assert_eq!(faults.count("UpdateItem"), 2);
    assert_eq!(faults.total(), 2);
    faults.set_enabled(false);
    faults.clear();
    faults.add(Rule::throttle("GetItem", Fault::Throttling));
    assert!(faults.draw("GetItem", b"{}").is_none(), "paused");
    faults.set_enabled(true);
    assert!(faults.draw("GetItem", b"{}").is_some());
    assert!(faults
        .to_string()
        .starts_with("fault injection seed 42: 3 injected"));
}

#[test]
fn index_queries_are_the_same_whatever_their_time_bound() {
    let at = |upper: &str, pk: &str| {
        format!(
            r##"{{"TableName":"t","IndexName":"due","KeyConditionExpression":"#shard = :pk AND #due < :upper","ExpressionAttributeValues":{{":pk":{{"S":"{pk}"}},":upper":{{"N":"{upper}"}}}},"Limit":4}}"##
        )
    };
    let key = super::plan::index_query_key(&at("1", "q#001")).expect("an index query");
    assert_eq!(
        super::plan::index_query_key(&at("2", "q#001")).as_deref(),
        Some(key.as_str())
    );
    assert_ne!(super::plan::index_query_key(&at("1", "q#002")), Some(key));
    assert_eq!(
        super::plan::index_query_key(r##"{"TableName":"t","KeyConditionExpression":"#pk = :pk"}"##),
        None,
        "a query of the table itself"
    );
    let rule = Rule::stale_index();
    assert_eq!(rule.when, When::AfterSend);
    assert!(matches!(
        planned(&rule, &at("1", "q#001")).action,
        Action::Stale
    ));
    assert!(Planned::new(
        &rule,
        r#"{"TableName":"t"}"#,
        &mut fastrand::Rng::with_seed(1)
    )
    .is_none());
}
