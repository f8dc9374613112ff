//! The order service over real HTTP: each test serves [`App`] on `127.0.0.1:0`
//! against the PostgreSQL named by `OUTBOX_PG_URL`, in a fresh schema, and talks to it
//! with a hyper client. Without `OUTBOX_PG_URL` the tests print a `SKIPPED` line (and
//! fail when `OUTBOX_REQUIRE_INTEGRATION=1`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::http::{header, Method, Request, StatusCode};
use example_postgres_service::{
    build, install, metrics_recorder, ApiError, InProcessBroker, OrderCreated, ServiceConfig,
    ORDER_CREATED,
};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use outbox::postgres::sqlx::postgres::PgPoolOptions;
use outbox::postgres::sqlx::{self, PgPool};
use outbox::postgres::{PgOutbox, PgOutboxConfig};
use outbox::testkit::wait::DEADLINE;
use outbox::testkit::{poll_for, wait_until, within};
use outbox::{DispatchReport, NewMessage, OutboxAdmin, Relay, RelayConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A fresh schema name, `obx_<unix seconds>_<random>`: the pattern the
/// `outbox-postgres` tests drop after an hour, so a schema a failed test leaves behind
/// is swept later.
fn schema_name() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("obx_{secs}_{}", &rand[..12])
}

/// The service, serving in a task of the test's runtime.
struct Service {
    addr: SocketAddr,
    pool: PgPool,
    schema: String,
    relay: Relay,
    broker: Arc<InProcessBroker>,
    outbox: PgOutbox,
    shutdown: CancellationToken,
    /// The serving task, until [`stop`](Self::stop) has awaited it.
    served: Option<JoinHandle<outbox::Result<DispatchReport>>>,
    /// The relay's totals, once stopped.
    totals: Option<DispatchReport>,
    http: Client<HttpConnector, Full<Bytes>>,
}

/// An HTTP answer: status, content type and body text.
struct Answer {
    status: StatusCode,
    content_type: String,
    body: String,
}

impl Answer {
    fn json<T: serde::de::DeserializeOwned>(&self) -> T {
        serde_json::from_str(&self.body).unwrap_or_else(|e| {
            panic!(
                "{}: not the expected JSON ({e}): {}",
                self.status, self.body
            )
        })
    }
}

impl Service {
    /// Install the schema and serve the service on `127.0.0.1:0`; `None` (after a
    /// visible skip line) without `OUTBOX_PG_URL`. `before` runs on the installed
    /// schema before the service starts.
    async fn start(what: &str) -> Option<Service> {
        Self::start_after(what, |_| async {}).await
    }

    async fn start_after<F, Fut>(what: &str, before: F) -> Option<Service>
    where
        F: FnOnce(PgOutbox) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let url = outbox::testkit::service_url("OUTBOX_PG_URL", what)?;
        // Pools are per test: each #[tokio::test] has its own runtime.
        let pool = PgPoolOptions::new()
            .max_connections(5)
            .acquire_timeout(Duration::from_secs(20))
            .connect(&url)
            .await
            .expect("connect to OUTBOX_PG_URL");
        let schema = schema_name();
        let config = ServiceConfig {
            schema: schema.clone(),
            // One metrics series per test: the recorder is the process's.
            relay: RelayConfig::default().with_name(schema.clone()),
            stats_interval: Duration::from_millis(50),
        };
        install(&pool, &config).await.expect("install");
        let metrics = metrics_recorder().expect("recorder");
        let probe = PgOutbox::new(
            pool.clone(),
            PgOutboxConfig::default().with_schema(schema.clone()),
        )
        .expect("outbox");
        before(probe).await;

        let app = build(pool.clone(), &config, metrics).expect("build");
        let (relay, broker, outbox) = (
            app.relay().clone(),
            app.broker().clone(),
            app.outbox().clone(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let shutdown = CancellationToken::new();
        let served = tokio::spawn(app.serve(listener, shutdown.clone().cancelled_owned()));
        Some(Service {
            addr,
            pool,
            schema,
            relay,
            broker,
            outbox,
            shutdown,
            served: Some(served),
            totals: None,
            http: Client::builder(TokioExecutor::new()).build_http(),
        })
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: &str,
    ) -> Answer {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        if let Some(content_type) = content_type {
            request = request.header(header::CONTENT_TYPE, content_type);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .expect("request");
        let response = within("an HTTP request", self.http.request(request))
            .await
            .expect("HTTP request");
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        Answer {
            status,
            content_type,
            body: String::from_utf8(body.to_vec()).expect("UTF-8 body"),
        }
    }

    async fn post_order(&self, body: &str) -> Answer {
        self.send(Method::POST, "/orders", Some("application/json"), body)
            .await
    }

    async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, None, "").await
    }

    async fn count(&self, table: &str) -> i64 {
        // The schema is ours (obx_...), the table a constant: plain identifiers.
        sqlx::query_scalar(&format!(
            r#"SELECT count(*) FROM "{}"."{table}""#,
            self.schema
        ))
        .fetch_one(&self.pool)
        .await
        .expect("count")
    }

    fn published_times(&self, id: &str) -> usize {
        self.broker
            .published()
            .iter()
            .filter(|m| m.id.to_string() == id)
            .count()
    }

    /// Fire the shutdown signal and wait for the server and the relay to stop.
    async fn stop(&mut self) -> DispatchReport {
        self.shutdown.cancel();
        if let Some(served) = self.served.take() {
            let totals = within("the service's shutdown", served)
                .await
                .expect("serve task")
                .expect("clean shutdown");
            self.totals = Some(totals);
        }
        self.totals.expect("stopped")
    }

    /// Stop, then drop the test's schema.
    async fn finish(mut self) -> DispatchReport {
        let totals = self.stop().await;
        sqlx::raw_sql(&format!(
            r#"DROP SCHEMA IF EXISTS "{}" CASCADE"#,
            self.schema
        ))
        .execute(&self.pool)
        .await
        .expect("drop schema");
        totals
    }
}

#[tokio::test]
async fn post_creates_the_order_and_publishes_its_event_once() {
    let Some(svc) = Service::start("postgres-service HTTP tests").await else {
        return;
    };
    let answer = svc
        .post_order(r#"{"customer":"ada","amount_cents":1250}"#)
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    let created: OrderCreated = answer.json();

    let (customer, amount, message_id): (String, i64, uuid::Uuid) = sqlx::query_as(&format!(
        r#"SELECT customer, amount_cents, message_id FROM "{}".orders WHERE id = $1"#,
        svc.schema
    ))
    .bind(created.order_id)
    .fetch_one(&svc.pool)
    .await
    .expect("the order row");
    assert_eq!((customer.as_str(), amount), ("ada", 1250));
    assert_eq!(
        message_id.to_string(),
        created.message_id,
        "the row names its event"
    );

    wait_until("the order's event to be published", || async {
        svc.published_times(&created.message_id) > 0
    })
    .await;
    // Once the relay has swept with nothing left, no second publish can come.
    svc.relay.wait_idle(DEADLINE).await.expect("relay idle");
    assert_eq!(
        svc.published_times(&created.message_id),
        1,
        "published exactly once"
    );
    let event = svc
        .broker
        .published()
        .into_iter()
        .find(|m| m.id.to_string() == created.message_id)
        .expect("published");
    assert_eq!(event.destination, ORDER_CREATED);
    let payload: serde_json::Value = serde_json::from_slice(&event.payload).expect("JSON payload");
    assert_eq!(payload["order_id"], created.order_id);
    assert_eq!(payload["amount_cents"], 1250);

    let stats = svc.outbox.stats().await.expect("stats");
    assert_eq!(
        (stats.pending, stats.in_flight, stats.dead),
        (0, 0, 0),
        "{stats:?}"
    );
    let totals = svc.finish().await;
    assert_eq!(totals.dispatched, 1, "{totals:?}");
}

#[tokio::test]
async fn bad_requests_get_4xx_and_write_nothing() {
    let Some(svc) = Service::start("postgres-service HTTP tests").await else {
        return;
    };
    let json = Some("application/json");
    for (content_type, body, status, says) in [
        (json, r#"{"customer":"#, StatusCode::BAD_REQUEST, "JSON"),
        (
            None,
            r#"{"customer":"ada","amount_cents":5}"#,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type",
        ),
        (
            json,
            r#"{"customer":5,"amount_cents":"x"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "customer",
        ),
        (
            json,
            r#"{"customer":"ada"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount_cents",
        ),
        (
            json,
            r#"{"customer":"ada","amount_cents":5,"discount":1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "discount",
        ),
        (
            json,
            r#"{"customer":"  ","amount_cents":5}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "blank",
        ),
        (
            json,
            r#"{"customer":"ada","amount_cents":0}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount_cents",
        ),
        (
            json,
            r#"{"customer":"ada","amount_cents":-5}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount_cents",
        ),
    ] {
        let answer = svc.send(Method::POST, "/orders", content_type, body).await;
        assert_eq!(answer.status, status, "{body}: {}", answer.body);
        assert!(
            answer.content_type.starts_with("application/json"),
            "{body}: {}",
            answer.content_type
        );
        let error: ApiError = answer.json();
        assert!(
            error.error.contains(says),
            "{body}: {:?} should mention {says}",
            error.error
        );
    }
    assert_eq!(svc.count("orders").await, 0, "no order row");
    assert_eq!(svc.count("outbox_messages").await, 0, "no outbox row");
    assert!(svc.broker.published().is_empty());
    svc.finish().await;
}

#[tokio::test]
async fn metrics_and_health_are_served() {
    let Some(svc) = Service::start("postgres-service HTTP tests").await else {
        return;
    };
    let health = svc.get("/healthz").await;
    assert_eq!(
        (health.status, health.body.as_str()),
        (StatusCode::OK, "ok")
    );

    let created: OrderCreated = svc
        .post_order(r#"{"customer":"grace","amount_cents":99}"#)
        .await
        .json();
    wait_until("the order's event to be published", || async {
        svc.published_times(&created.message_id) > 0
    })
    .await;

    let dispatched = format!(
        r#"outbox_messages_dispatched_total{{relay="{}"}} 1"#,
        svc.schema
    );
    let pending = format!(
        r#"outbox_pending_messages{{outbox="{}.outbox_messages"}} 0"#,
        svc.schema
    );
    // The relay counts a dispatch once its settle has returned, a moment after the
    // store (and so the pending gauge) shows the row gone: wait for both.
    let text = poll_for(
        "the stats gauges and counters to show the drained outbox",
        || async {
            let answer = svc.get("/metrics").await;
            assert_eq!(answer.status, StatusCode::OK);
            assert!(
                answer.content_type.starts_with("text/plain"),
                "{}",
                answer.content_type
            );
            (answer.body.contains(&pending) && answer.body.contains(&dispatched))
                .then_some(answer.body)
        },
    )
    .await;
    assert!(
        text.contains("# HELP outbox_messages_dispatched_total"),
        "{text}"
    );
    assert!(text.contains("outbox_claim_duration_seconds"), "{text}");
    svc.finish().await;
}

#[tokio::test]
async fn the_background_relay_sweeps_what_no_request_dispatched() {
    // A message committed by an earlier process that died before dispatching it.
    let left = NewMessage::builder(ORDER_CREATED)
        .payload(br#"{"order_id":0}"#.to_vec())
        .build()
        .expect("message");
    let id = left.id().to_string();
    let Some(svc) = Service::start_after("postgres-service HTTP tests", |outbox| async move {
        let mut tx = outbox.pool().begin().await.expect("begin");
        outbox.enqueue(&mut tx, &[left]).await.expect("enqueue");
        tx.commit().await.expect("commit");
    })
    .await
    else {
        return;
    };
    wait_until("the relay to sweep the leftover", || async {
        svc.published_times(&id) > 0
    })
    .await;
    svc.relay.wait_idle(DEADLINE).await.expect("relay idle");
    assert_eq!(svc.published_times(&id), 1);
    svc.finish().await;
}

#[tokio::test]
async fn shutdown_stops_the_server_and_the_relay() {
    let Some(mut svc) = Service::start("postgres-service HTTP tests").await else {
        return;
    };
    // The client keeps this connection open: shutdown must not wait for it.
    let answer = svc
        .post_order(r#"{"customer":"linus","amount_cents":7}"#)
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    // The dispatch after commit can lose the claim to the background relay, whose
    // batch may still be publishing when the answer comes: a stop then would release
    // it (as shutdown should). Stop once the event is out.
    let created: OrderCreated = answer.json();
    wait_until("the order's event to be published", || async {
        svc.published_times(&created.message_id) > 0
    })
    .await;

    let totals = svc.stop().await;
    assert_eq!(totals.dispatched, 1, "{totals:?}");
    assert!(svc.relay.is_stopping());
    assert_eq!(
        svc.relay
            .dispatch_ids(&[outbox::MessageId::new()])
            .await
            .expect("no-op"),
        DispatchReport::default(),
        "a stopped relay claims nothing"
    );
    let stats = svc.outbox.stats().await.expect("stats");
    assert_eq!(stats.in_flight, 0, "no lease outlives shutdown: {stats:?}");
    assert!(
        tokio::net::TcpStream::connect(svc.addr).await.is_err(),
        "the listener is closed"
    );
    svc.finish().await;
}
