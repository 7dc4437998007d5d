//! What a study's `trial_job` may ask of the server's machines: each test plays an attack of
//! issue 26 against a real server and checks it is refused with the field named.

use crate::common;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// A random-search study of two trials whose job is `job` (never dispatched here).
fn with_job(job: Value) -> Value {
    let mut s = common::spec("random", 2, 1);
    s["trial_job"] = job;
    s
}

/// `POST /v1/studies` with `spec`, as `token` (or the open server's caller).
async fn create(app: &common::TestApp, token: Option<&str>, spec: Value) -> common::Response {
    common::call(
        &app.http,
        &app.base,
        token,
        Method::POST,
        "/v1/studies",
        Some(spec),
    )
    .await
}

fn assert_refused(r: &common::Response, status: StatusCode, field: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    assert_eq!(r.body["error"]["field"], field, "{}", r.body);
}

/// `--job-commands` is checked against what runs, not against the template: a placeholder
/// in the program (filled in per trial from a categorical such as `../../../bin/sh`) would
/// leave the allowed directory.
#[tokio::test]
async fn a_placeholder_cannot_choose_the_program_under_job_commands() {
    let app = common::spawn_app_configured(common::sqlite_db(), |c| {
        c.dispatch = false;
        c.job_commands = vec![
            "/opt/trainers/".into(),
            "/usr/bin/python3 /opt/scripts/train.py".into(),
        ];
    })
    .await;
    let mut spec = with_job(json!({"command": ["/opt/trainers/${p}", "-c", "id"]}));
    spec["parameters"] = json!([{"id": "p", "type": "categorical", "values": ["../../../bin/sh"]}]);
    assert_refused(
        &create(&app, None, spec).await,
        StatusCode::FORBIDDEN,
        "trial_job.command[0]",
    );
    // A placeholder in a word a whole-argument prefix covers is no match either.
    let mut spec = with_job(json!({"command": ["/usr/bin/python3", "${script}"]}));
    spec["parameters"] =
        json!([{"id": "script", "type": "categorical", "values": ["/opt/scripts/train.py"]}]);
    assert_refused(
        &create(&app, None, spec).await,
        StatusCode::FORBIDDEN,
        "trial_job.command",
    );
    // Values after what the prefix covers are the allowed program's arguments.
    let spec = with_job(json!({"command": ["/opt/trainers/train", "--x=${x}"]}));
    let r = create(&app, None, spec).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

/// An image is an argument of `podman run`: one that reads as engine options
/// (`--privileged --volume=/:/host`) is not an image reference, in the job or in a pool.
#[tokio::test]
async fn an_image_that_reads_as_engine_options_is_refused() {
    let app = common::spawn_app_configured(common::sqlite_db(), |c| c.dispatch = false).await;
    let attack = "--privileged --volume=/:/host --user=0:0 docker.io/library/debian";
    let job = |image: &str, pool_image: Option<&str>| {
        let mut job = json!({"executor": "container", "image": image, "command": ["python3"]});
        if let Some(pool) = pool_image {
            job["worker_pools"] = json!([{}, {"replicas": 1, "image": pool}]);
        }
        with_job(job)
    };
    for (spec, field) in [
        (job(attack, None), "trial_job.image"),
        (job("--privileged", None), "trial_job.image"),
        (
            job("localhost/trainer:1", Some(attack)),
            "trial_job.worker_pools[1].image",
        ),
    ] {
        let r = create(&app, None, spec).await;
        assert_refused(&r, StatusCode::BAD_REQUEST, field);
        assert!(
            r.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("image reference")),
            "{}",
            r.body
        );
    }
    let r = create(&app, None, job("localhost/trainer:1", None)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

/// `--job-images` matches by parts: `allowed/image` is not a prefix of
/// `allowed/imagex` nor of `allowed/image.evil.example/x`.
#[tokio::test]
async fn allowed_images_are_matched_by_their_parts() {
    let app = common::spawn_app_configured(common::sqlite_db(), |c| {
        c.dispatch = false;
        c.job_images = vec!["allowed/image".into(), "registry.example.com/ml/".into()];
    })
    .await;
    let spec = |image: &str| {
        with_job(json!({"executor": "container", "image": image, "command": ["python3"]}))
    };
    for image in [
        "allowed/imagex:1",
        "allowed/image.evil.example/x",
        "registry.example.com/mlx/t:1",
        "registry.example.com.evil.example/ml/t",
    ] {
        assert_refused(
            &create(&app, None, spec(image)).await,
            StatusCode::FORBIDDEN,
            "trial_job.image",
        );
    }
    for image in [
        "allowed/image",
        "allowed/image:2",
        "registry.example.com/ml/team/t:1",
    ] {
        let r = create(&app, None, spec(image)).await;
        assert_eq!(r.status, StatusCode::CREATED, "{image}: {}", r.body);
    }
    // An entry that is no image reference stops the server at start-up.
    let db = common::sqlite_db();
    let mut config = augur::ServerConfig::new(db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
    config.job_images = vec!["--privileged".into()];
    let e = augur::App::build(config)
        .await
        .err()
        .expect("a bad --job-images entry is refused");
    assert!(e.to_string().contains("--job-images"), "{e}");
}

/// Slurm's options that name files slurmd (root) opens, or the user a job runs as, are not a
/// spec's to pass.
#[tokio::test]
async fn sbatch_options_a_spec_may_pass_are_an_allow_list() {
    let app = common::spawn_app_configured(common::sqlite_db(), |c| c.dispatch = false).await;
    let spec = |args: Value| {
        with_job(
            json!({"executor": "slurm", "command": ["/bin/true"], "slurm": {"sbatch_args": args}}),
        )
    };
    for (args, index) in [
        (json!(["--mem=1G", "--output=/root/.bashrc"]), 1),
        (json!(["--open-mode=truncate"]), 0),
        (json!(["--uid=0"]), 0),
        (json!(["--get-user-env"]), 0),
        (json!(["--export=ALL"]), 0),
        (json!(["--chdir=/root"]), 0),
        (json!(["-o", "/etc/passwd"]), 0),
        (json!(["--gres=gpu:1", "--error=/etc/shadow"]), 1),
    ] {
        let r = create(&app, None, spec(args.clone())).await;
        assert_refused(
            &r,
            StatusCode::BAD_REQUEST,
            &format!("trial_job.slurm.sbatch_args[{index}]"),
        );
    }
    let r = create(
        &app,
        None,
        spec(json!([
            "--gres=gpu:1",
            "--time=10",
            "--constraint=a100",
            "--exclusive"
        ])),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

/// Pods that pass for the server (its labels) or run as its service account, in namespaces
/// and with claims the operator did not list, are refused; an admin may place pods, but
/// never in the server's own account.
#[tokio::test]
async fn kubernetes_placement_is_the_operators_to_allow() {
    const ADMIN: &str = "admin-token-for-kubernetes-placement";
    let app = common::spawn_app_configured(common::sqlite_db(), |c| {
        c.dispatch = false;
        c.token = Some(ADMIN.into());
        c.kubernetes_policy = augur::service::KubernetesPolicy {
            service_accounts: vec!["trainer".into()],
            namespaces: vec!["ml".into()],
            claims: vec!["runs".into()],
            own_service_account: Some("augur".into()),
        };
    })
    .await;
    let made = app
        .post("/v1/tokens", json!({"name": "ops", "role": "operator"}))
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let ops = made.body["token"].as_str().expect("token").to_string();
    let spec = |options: Value| {
        with_job(json!({
            "executor": "kubernetes", "image": "registry.example.com/ml/t:1",
            "command": ["python3"], "kubernetes": options
        }))
    };
    let claim = |name: &str| json!({"output_volume": {"persistent_volume_claim": {"claim_name": name, "mount_path": "/mnt/runs"}}});
    for (options, status, field) in [
        (
            json!({"service_account": "augur"}),
            StatusCode::FORBIDDEN,
            "trial_job.kubernetes.service_account",
        ),
        (
            json!({"service_account": "default"}),
            StatusCode::FORBIDDEN,
            "trial_job.kubernetes.service_account",
        ),
        (
            json!({"namespace": "kube-system"}),
            StatusCode::FORBIDDEN,
            "trial_job.kubernetes.namespace",
        ),
        (
            claim("augur-postgres-data"),
            StatusCode::FORBIDDEN,
            "trial_job.kubernetes.output_volume.claim_name",
        ),
        (
            json!({"labels": {"app.kubernetes.io/name": "augur"}}),
            StatusCode::BAD_REQUEST,
            "trial_job.kubernetes.labels.app.kubernetes.io/name",
        ),
        (
            json!({"labels": {"augur.dev/study": "1"}}),
            StatusCode::BAD_REQUEST,
            "trial_job.kubernetes.labels.augur.dev/study",
        ),
        (
            json!({"annotations": {"env.augur.dev/AUGUR_TRIAL_TOKEN": "x"}}),
            StatusCode::BAD_REQUEST,
            "trial_job.kubernetes.annotations.env.augur.dev/AUGUR_TRIAL_TOKEN",
        ),
    ] {
        let r = create(&app, Some(&ops), spec(options.clone())).await;
        assert_refused(&r, status, field);
    }
    let listed = spec(json!({
        "service_account": "trainer", "namespace": "ml",
        "labels": {"team": "vision", "sidecar.istio.io/inject": "false"}
    }));
    let r = create(&app, Some(&ops), listed).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = create(&app, Some(&ops), spec(claim("runs"))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // An admin may name what the lists do not, but not the server's own account.
    let r = create(
        &app,
        Some(ADMIN),
        spec(json!({"service_account": "default", "namespace": "other"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = create(&app, Some(ADMIN), spec(json!({"service_account": "augur"}))).await;
    assert_refused(
        &r,
        StatusCode::FORBIDDEN,
        "trial_job.kubernetes.service_account",
    );
}
