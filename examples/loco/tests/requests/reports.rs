use loco_rs::testing::prelude::*;
use serial_test::serial;
use todo_app::app::App;

/// The test config runs Loco's `perform_later` inline (`ForegroundBlocking`); the
/// transactional endpoint goes through the queue and says created or existing.
#[tokio::test]
#[serial]
async fn repeated_report_requests_get_one_job() {
    request::<App, _, _>(|request, _ctx| async move {
        let body = serde_json::json!({"user_id": 1, "month": "2026-11"});
        let inline = request.post("/api/reports").json(&body).await;
        assert_eq!(inline.status_code(), 200);
        let first = request
            .post("/api/reports/in_transaction")
            .json(&body)
            .await;
        assert_eq!(first.status_code(), 200);
        let second = request
            .post("/api/reports/in_transaction")
            .json(&body)
            .await;
        let first: serde_json::Value = first.json();
        let second: serde_json::Value = second.json();
        assert_eq!(first["job_id"], second["job_id"]);
        assert_eq!(
            (&first["created"], &second["created"]),
            (&true.into(), &false.into())
        );
        let other = request
            .post("/api/reports/in_transaction")
            .json(&serde_json::json!({"user_id": 2, "month": "2026-11"}))
            .await;
        let other: serde_json::Value = other.json();
        assert_ne!(other["job_id"], first["job_id"]);
    })
    .await;
}

#[tokio::test]
#[serial]
async fn a_failed_request_enqueues_nothing() {
    request::<App, _, _>(|request, _ctx| async move {
        let failed = request
            .post("/api/reports/in_transaction")
            .json(
                &serde_json::json!({"user_id": 3, "month": "2026-11", "fail_after_enqueue": true}),
            )
            .await;
        assert_eq!(failed.status_code(), 400);
        let ok = request
            .post("/api/reports/in_transaction")
            .json(&serde_json::json!({"user_id": 3, "month": "2026-11"}))
            .await;
        assert_eq!(ok.status_code(), 200);
        let ok: serde_json::Value = ok.json();
        assert_eq!(ok["created"], true, "the failed request left no job behind");
    })
    .await;
}
