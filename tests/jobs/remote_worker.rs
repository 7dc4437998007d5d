//! `augur worker` on another machine: a server on node1 serving HTTPS with a certificate of
//! its own (for the name `node1`), a worker on node3 that reaches it by that name with the
//! certificate as its CA and a token, running a study's trials on node3; a worker that does
//! not trust the certificate is refused before it asks for anything.

use std::time::Duration;

use crate::common::{self, KillOnDrop, TestCluster, routes};

const ADMIN: &str = "remote-worker-admin-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_another_node_runs_trials_over_tls_with_a_token() {
    const TRIALS: i64 = 4;
    let cluster = TestCluster::up(3);
    let dir = cluster.dir.join("remote-worker");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    let addr = cluster.addr("node1");
    let made = rcgen::generate_simple_self_signed(vec!["node1".to_string(), addr.clone()])
        .expect("certificate");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).expect("cert");
    std::fs::write(&key, made.signing_key.serialize_pem()).expect("key");
    let _server = KillOnDrop(
        cluster
            .command("node1", common::augur_bin())
            .args([
                "serve",
                "--token",
                ADMIN,
                "--listen",
                &format!("{addr}:8443"),
            ])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .arg("--database-url")
            .arg(format!("sqlite://{}", dir.join("augur.db").display()))
            .env("AUGUR_LOG", "warn")
            .env_remove("AUGUR_TOKEN")
            .stdout(std::process::Stdio::null())
            .stderr(cluster.log("remote-worker-augur.log"))
            .spawn()
            .expect("augur serve"),
    );
    let base = format!("https://{addr}:8443");
    let pem = made.cert.pem();
    let node2 = cluster.runtime("node2", 1);
    let study = {
        let (base, pem) = (base.clone(), pem.clone());
        node2
            .run(async move {
                let http = common::http_builder()
                    .tls_certs_only([reqwest::Certificate::from_pem(pem.as_bytes()).expect("pem")])
                    .build()
                    .expect("client");
                common::eventually("ready", Duration::from_secs(30), || async {
                    match http.get(format!("{base}/readyz")).send().await {
                        Ok(r) if r.status().is_success() => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                })
                .await;
                let spec = common::x_spec("remote", ("accuracy", "maximize"), TRIALS, 2, 7);
                let post = reqwest::Method::POST;
                let made =
                    common::call(&http, &base, Some(ADMIN), post, "/v1/studies", Some(spec)).await;
                assert_eq!(made.status, 201, "{}", made.body);
                made.body["id"].as_i64().expect("id")
            })
            .await
    };
    let script = dir.join("trial.sh");
    let events = dir.join("events.txt");
    std::fs::write(
        &script,
        format!(
            "echo \"$AUGUR_TRIAL_ID $(hostname)\" >> {}\necho accuracy=0.5\n",
            events.display()
        ),
    )
    .expect("script");
    let worker = |ca: bool| {
        let mut command = cluster.command("node3", common::augur_bin());
        command
            .args([
                "worker",
                "--url",
                "https://node1:8443",
                "--study",
                &study.to_string(),
            ])
            .args(["--slots", "2", "--client-id", "node3", "--output-dir"])
            .arg(dir.join("runs"));
        if ca {
            command.arg("--ca-cert").arg(&cert);
        }
        command
            .args(["--", "/bin/sh"])
            .arg(&script)
            .env("AUGUR_TOKEN", ADMIN)
            .env("AUGUR_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        command
    };
    // Without the certificate: refused at the handshake, no trial asked for.
    let untrusting = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking({
            let mut command = worker(false);
            move || command.output().expect("augur worker")
        }),
    )
    .await
    .expect("the untrusting worker gives up")
    .expect("join");
    let said = String::from_utf8_lossy(&untrusting.stderr).to_lowercase();
    assert!(!untrusting.status.success(), "{said}");
    assert!(said.contains("certificate"), "{said}");
    // With it: every trial runs on node3 and the worker exits once the study has ended.
    let trusting = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::task::spawn_blocking({
            let mut command = worker(true);
            move || command.output().expect("augur worker")
        }),
    )
    .await
    .expect("the worker ends with the study")
    .expect("join");
    assert!(
        trusting.status.success(),
        "{}",
        String::from_utf8_lossy(&trusting.stderr)
    );
    let ran = std::fs::read_to_string(&events).unwrap_or_default();
    let lines: Vec<&str> = ran.lines().collect();
    assert_eq!(lines.len() as i64, TRIALS, "each trial once: {ran}");
    assert!(lines.iter().all(|l| l.ends_with(" node3")), "{ran}");
    let state = node2
        .run(async move {
            let http = common::http_builder()
                .tls_certs_only([reqwest::Certificate::from_pem(pem.as_bytes()).expect("pem")])
                .build()
                .expect("client");
            let get = reqwest::Method::GET;
            let path = routes::study(study);
            common::call(&http, &base, Some(ADMIN), get, &path, None)
                .await
                .body
        })
        .await;
    assert_eq!(state["state"], "completed", "{state}");
    assert_eq!(state["trial_counts"]["completed"], TRIALS, "{state}");
}
