//! The HTTP routes: `POST /orders`, `GET /metrics`, `GET /healthz`.

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use outbox::postgres::sqlx::{self, PgPool};
use outbox::postgres::{PgOutbox, QualifiedName};
use outbox::{NewMessage, Relay};
use serde::{Deserialize, Serialize};

/// The destination of the event every new order enqueues.
pub const ORDER_CREATED: &str = "orders.created";
/// Longest customer name accepted, in characters.
pub const MAX_CUSTOMER_CHARS: usize = 200;
/// Largest amount accepted, in cents.
pub const MAX_AMOUNT_CENTS: i64 = 100_000_000;

/// The body of `POST /orders`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewOrder {
    /// Who ordered: 1 to [`MAX_CUSTOMER_CHARS`] characters, not blank, no control
    /// characters.
    pub customer: String,
    /// The total, in cents: 1 to [`MAX_AMOUNT_CENTS`].
    pub amount_cents: i64,
}

impl NewOrder {
    /// Check the order before anything is written.
    ///
    /// # Errors
    /// A message naming the broken rule, fit for the client.
    pub fn validate(&self) -> Result<(), String> {
        let chars = self.customer.chars().count();
        if self.customer.trim().is_empty() {
            return Err("customer must not be blank".to_owned());
        }
        if chars > MAX_CUSTOMER_CHARS {
            return Err(format!(
                "customer is {chars} characters long; the limit is {MAX_CUSTOMER_CHARS}"
            ));
        }
        if self.customer.chars().any(char::is_control) {
            return Err("customer must not contain control characters".to_owned());
        }
        if !(1..=MAX_AMOUNT_CENTS).contains(&self.amount_cents) {
            return Err(format!(
                "amount_cents must be between 1 and {MAX_AMOUNT_CENTS}, got {}",
                self.amount_cents
            ));
        }
        Ok(())
    }
}

/// The body of a `201 Created` answer to `POST /orders`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderCreated {
    /// The new order's id.
    pub order_id: i64,
    /// The id of its [`ORDER_CREATED`] message.
    pub message_id: String,
    /// Whether the dispatch right after commit published the message. When `false`
    /// (the broker failed, or the relay is shutting down) the background relay
    /// publishes it later: the message committed with the order.
    pub dispatched_on_commit: bool,
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong, and what to change when it is the client's fault.
    pub error: String,
}

/// An error answer: a status and an [`ApiError`] body.
#[derive(Debug)]
struct Failure(StatusCode, String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(ApiError { error: self.1 })).into_response()
    }
}

impl From<JsonRejection> for Failure {
    fn from(rejection: JsonRejection) -> Self {
        // Missing content type (415), broken JSON (400), wrong fields (422), too large
        // (413): axum's status and text say which.
        Failure(rejection.status(), rejection.body_text())
    }
}

/// A storage error: logged with its causes, answered without them.
fn storage_failure(what: &str, err: &outbox::Error) -> Failure {
    tracing::error!(error = %err.report(), "{what} failed");
    let status = if err.is_retryable() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    Failure(status, format!("{what} failed; try again later"))
}

fn db_error(e: sqlx::Error) -> outbox::Error {
    outbox::Error::new(outbox::ErrorKind::Storage, "order SQL failed").with_source(e)
}

/// What every handler shares.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    pub(crate) pool: PgPool,
    pub(crate) outbox: PgOutbox,
    pub(crate) orders: QualifiedName,
    pub(crate) relay: Relay,
    pub(crate) metrics: PrometheusHandle,
}

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(healthz))
        .with_state(state)
}

async fn create_order(
    State(state): State<AppState>,
    body: Result<Json<NewOrder>, JsonRejection>,
) -> Result<(StatusCode, Json<OrderCreated>), Failure> {
    let Json(order) = body?;
    order
        .validate()
        .map_err(|message| Failure(StatusCode::UNPROCESSABLE_ENTITY, message))?;
    let (order_id, event) = store_order(&state, &order)
        .await
        .map_err(|e| storage_failure("storing the order", &e))?;

    // Committed: publish now rather than at the relay's next poll. In its own task,
    // because `dispatch_ids` is not cancel-safe and hyper drops this handler's future
    // when the client hangs up; the task finishes the claim-publish-settle round.
    let relay = state.relay.clone();
    let id = event.id();
    let dispatched = tokio::spawn(async move { relay.dispatch_ids(&[id]).await }).await;
    let dispatched_on_commit = match dispatched {
        Ok(Ok(report)) => report.dispatched == 1,
        Ok(Err(err)) => {
            tracing::warn!(%id, error = %err.report(), "dispatch after commit failed; the relay will sweep it");
            false
        }
        Err(err) => {
            tracing::warn!(%id, error = %err, "dispatch after commit panicked; the relay will sweep it");
            false
        }
    };
    if !dispatched_on_commit {
        state.relay.wakeup().wake();
    }
    Ok((
        StatusCode::CREATED,
        Json(OrderCreated {
            order_id,
            message_id: id.to_string(),
            dispatched_on_commit,
        }),
    ))
}

/// The order row and its event, in one transaction.
async fn store_order(state: &AppState, order: &NewOrder) -> outbox::Result<(i64, NewMessage)> {
    let mut tx = state.pool.begin().await.map_err(db_error)?;
    // The event's id is chosen before the insert, so the row can name its event.
    let event_id = outbox::MessageId::new();
    let order_id: i64 = sqlx::query_scalar(&format!(
        "INSERT INTO {} (customer, amount_cents, message_id) VALUES ($1, $2, $3) RETURNING id",
        state.orders
    ))
    .bind(&order.customer)
    .bind(order.amount_cents)
    .bind(event_id.as_uuid())
    .fetch_one(&mut *tx)
    .await
    .map_err(db_error)?;
    let payload = serde_json::json!({
        "order_id": order_id,
        "customer": order.customer,
        "amount_cents": order.amount_cents,
    });
    let event = NewMessage::builder(ORDER_CREATED)
        .id(event_id)
        .partition_key(format!("order-{order_id}"))
        .content_type("application/json")
        .payload(payload.to_string())
        .build()?;
    state
        .outbox
        .enqueue(&mut tx, std::slice::from_ref(&event))
        .await?;
    tx.commit().await.map_err(db_error)?;
    Ok((order_id, event))
}

async fn render_metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

async fn healthz(State(state): State<AppState>) -> Result<&'static str, Failure> {
    if state.relay.is_stopping() {
        return Err(Failure(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down".to_owned(),
        ));
    }
    sqlx::query("SELECT 1")
        .execute(&state.pool)
        .await
        .map_err(|e| storage_failure("reaching the database", &db_error(e)))?;
    Ok("ok")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(customer: &str, amount_cents: i64) -> NewOrder {
        NewOrder {
            customer: customer.to_owned(),
            amount_cents,
        }
    }

    #[test]
    fn validation_names_the_broken_rule() {
        assert_eq!(order("ada", 1).validate(), Ok(()));
        assert_eq!(
            order(&"é".repeat(MAX_CUSTOMER_CHARS), MAX_AMOUNT_CENTS).validate(),
            Ok(())
        );
        for (bad, rule) in [
            (order("", 5), "blank"),
            (order("  ", 5), "blank"),
            (order(&"x".repeat(MAX_CUSTOMER_CHARS + 1), 5), "limit"),
            (order("a\u{0}b", 5), "control"),
            (order("ada", 0), "amount_cents"),
            (order("ada", -3), "amount_cents"),
            (order("ada", MAX_AMOUNT_CENTS + 1), "amount_cents"),
        ] {
            let err = bad.validate().expect_err("rejected");
            assert!(err.contains(rule), "{bad:?}: {err}");
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        let body = r#"{"customer":"ada","amount_cents":5,"discount":100}"#;
        assert!(serde_json::from_str::<NewOrder>(body).is_err());
    }
}
