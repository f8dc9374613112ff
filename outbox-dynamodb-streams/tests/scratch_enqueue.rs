#[path = "streams/common.rs"]
mod common;
use outbox_core::NewMessage;
use std::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scratch() {
    let url = common::url("x").unwrap();
    let outbox = common::outbox(&url, "scratch").await;
    let start = Instant::now();
    for round in 0..4 {
        let msgs: Vec<NewMessage> = (0..1000)
            .map(|_| {
                NewMessage::builder("d")
                    .payload(b"x".to_vec())
                    .build()
                    .unwrap()
            })
            .collect();
        for c in msgs.chunks(100) {
            outbox.enqueue(Vec::new(), c).await.unwrap();
        }
        eprintln!("round {round}: total {:.1?}", start.elapsed());
    }
    outbox.drop_tables().await.unwrap();
}
