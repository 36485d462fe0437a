use loco_rs::{bgworker::BackgroundWorker, testing::prelude::*};
use serial_test::serial;
use todo_app::{
    app::App,
    workers::report::{Worker, WorkerArgs},
};

#[tokio::test]
#[serial]
async fn test_run_report_worker() {
    let boot = boot_test::<App>().await.unwrap();

    // Execute the worker ensuring that it operates in 'ForegroundBlocking' mode, which prevents the addition of your worker to the background
    assert!(Worker::perform_later(
        &boot.app_context,
        WorkerArgs {
            user_id: 1,
            month: "2026-11".into(),
            render_ms: 0
        }
    )
    .await
    .is_ok());
    // Include additional assert validations after the execution of the worker
}
