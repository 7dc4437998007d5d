//! Replicas on one PostgreSQL that route each study's changes to one of them
//! (`--replica-url`, `src/api/forward.rs`): real `augur serve` processes. The cap under
//! concurrent load through routed replicas is in `concurrency.rs`.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{self, ServerProcess, free_port, routes, routes::vizier};
use crate::support::{worker_command, worker_log};

const ADMIN: &str = "replicas-admin-token";

/// A replica on `db` that routes, with an admin token and more arguments.
fn routed(db: &common::TestDb, more: &[&str]) -> ServerProcess {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut args = vec!["--no-dispatch", "--token", ADMIN, "--replica-url", &url];
    args.extend_from_slice(more);
    ServerProcess::start_with(&db.url, port, &args)
}

/// Two routing replicas on `db` that see each other live.
async fn two_routed(db: &common::TestDb) -> (ServerProcess, ServerProcess) {
    let a = routed(db, &[]);
    a.wait_ready().await;
    let b = routed(db, &[]);
    b.wait_ready().await;
    until_live(&[&a.base, &b.base], 2.0).await;
    (a, b)
}

async fn call(base: &str, method: Method, path: &str, body: Option<Value>) -> common::Response {
    common::call(&common::http(), base, Some(ADMIN), method, path, body).await
}

async fn metric(base: &str, series: &str) -> f64 {
    common::metric_sample(base, Some(ADMIN), series).await
}

const FORWARDED: &str = "augur_forwarded_requests_total{outcome=\"forwarded\"}";
const SERVED_HERE: &str = "augur_forwarded_requests_total{outcome=\"served_here\"}";
const LIVE: &str = "augur_replicas_live";

/// Wait until every replica sees `n` live replicas.
async fn until_live(bases: &[&str], n: f64) {
    common::until_replicas_live(bases, Some(ADMIN), n).await;
}

/// `n` studies through `base`, one every `pace` (a rate-limited server's refill).
async fn create_studies_paced(base: &str, n: usize, pace: Duration) -> Vec<i64> {
    let mut ids = Vec::new();
    for i in 0..n {
        tokio::time::sleep(pace).await;
        let mut spec = common::spec("random", 1000, 100);
        spec["name"] = json!(format!("routed-{i}"));
        let created = call(base, Method::POST, "/v1/studies", Some(spec)).await;
        assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
        ids.push(created.body["id"].as_i64().expect("study id"));
    }
    ids
}

async fn create_studies(base: &str, n: usize) -> Vec<i64> {
    create_studies_paced(base, n, Duration::ZERO).await
}

async fn suggest(base: &str, study: i64) -> common::Response {
    call(
        base,
        Method::POST,
        &routes::suggest(study),
        Some(json!({"count": 1})),
    )
    .await
}

/// `n` suggests of `study` sent to `base` at once (from one client, its connections opened
/// first so that the requests leave together), each answered with one trial.
async fn overlapping_suggests(base: &str, study: i64, n: usize) {
    let http = common::http();
    let warmed =
        (0..n).map(|_| common::call(&http, base, Some(ADMIN), Method::GET, "/healthz", None));
    futures::future::join_all(warmed).await;
    let path = routes::suggest(study);
    let answers = futures::future::join_all((0..n).map(|_| {
        common::call(
            &http,
            base,
            Some(ADMIN),
            Method::POST,
            &path,
            Some(json!({"count": 1})),
        )
    }))
    .await;
    for answer in answers {
        assert_eq!(answer.status, StatusCode::OK, "{base}: {:?}", answer.body);
        assert_eq!(answer.body["trials"].as_array().map(Vec::len), Some(1));
    }
}

/// A suggest of `study` at `base`: its status, and the owner the answer names
/// (`augur-study-replica`), if it names one.
async fn suggest_naming_owner(base: &str, study: i64) -> (StatusCode, Option<String>) {
    let answer = common::http()
        .post(format!("{base}{}", routes::suggest(study)))
        .bearer_auth(ADMIN)
        .json(&json!({"count": 1}))
        .send()
        .await
        .expect("sent");
    let owner = answer
        .headers()
        .get(augur::model::request::STUDY_REPLICA_HEADER)
        .map(|v| v.to_str().expect("ASCII").to_string());
    (answer.status(), owner)
}

/// The replica of `bases` whose changes of `study` it sends on: three suggests at once to
/// one replica, then the other, until one sends one on (that one does not own the study).
async fn router_of(bases: [&str; 2], study: i64) -> &str {
    for _ in 0..5 {
        for base in bases {
            let before = metric(base, FORWARDED).await;
            overlapping_suggests(base, study, 3).await;
            if metric(base, FORWARDED).await > before {
                return base;
            }
        }
    }
    panic!("no replica routed study {study}");
}

/// A replica row for `url` (a stand-in, not an `augur serve`), live for an hour.
async fn register_stand_in(db: &common::TestDb, url: &str) {
    let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
    sqlx::query(
        "INSERT INTO replicas (id, url, expires_at) VALUES ('stand-in', $1, now() + interval '1 hour')",
    )
    .bind(url)
    .execute(&pool)
    .await
    .expect("stand-in registered");
}

async fn forwarded(bases: &[&str]) -> f64 {
    let mut sum = 0.0;
    for base in bases {
        sum += metric(base, FORWARDED).await;
    }
    sum
}

/// Changes of a study that never overlap are served where they arrive (a hop would only
/// add latency); once a study's changes overlap at a replica, that replica sends them to the
/// study's owner, and keeps doing so for a while; reads stay where they arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_changes_of_a_study_go_to_one_replica() {
    let db = common::postgres_db().await;
    let (a, b) = two_routed(&db).await;
    let bases = [a.base.as_str(), b.base.as_str()];
    let studies = create_studies(&a.base, 20).await;
    // One at a time, through both replicas: nothing is sent on, and the replica that does
    // not own the study names the one that does.
    let mut named_owners = Vec::new();
    for &study in &studies {
        let at_a = suggest_naming_owner(&a.base, study).await;
        let at_b = suggest_naming_owner(&b.base, study).await;
        let named = match (at_a, at_b) {
            ((StatusCode::OK, None), (StatusCode::OK, Some(named))) => named,
            ((StatusCode::OK, Some(named)), (StatusCode::OK, None)) => named,
            other => panic!("study {study}: one replica names the other: {other:?}"),
        };
        assert!(named == a.base || named == b.base, "{named}");
        named_owners.push(named);
    }
    assert_eq!(forwarded(&bases).await, 0.0);
    let mut sent_on_by = Vec::new();
    for (&study, named) in studies.iter().zip(&named_owners) {
        // The replica that sends some on does not own the study, and now routes it.
        let router = router_of(bases, study).await;
        let owner = if router == a.base { &b.base } else { &a.base };
        assert_eq!(
            owner, named,
            "study {study}: routed to the owner named before"
        );
        // One at a time now: the router sends it on and names the owner in its answer; the
        // owner serves its own, naming nobody.
        let (router_before, owner_before) = (
            metric(router, FORWARDED).await,
            metric(owner, FORWARDED).await,
        );
        assert_eq!(
            suggest_naming_owner(router, study).await,
            (StatusCode::OK, Some(owner.clone()))
        );
        assert_eq!(
            suggest_naming_owner(owner, study).await,
            (StatusCode::OK, None)
        );
        assert_eq!(metric(router, FORWARDED).await, router_before + 1.0);
        assert_eq!(metric(owner, FORWARDED).await, owner_before);
        sent_on_by.push(router);
    }
    // Rendezvous hashing spreads 20 studies over both (each owns some).
    assert!(sent_on_by.contains(&bases[0]) && sent_on_by.contains(&bases[1]));
    // Reads are served where they arrive, and see what the owners wrote.
    for &study in &studies {
        let before = forwarded(&bases).await;
        let trials = call(&b.base, Method::GET, &routes::trials(study), None).await;
        let all = call(&a.base, Method::GET, &routes::trials(study), None).await;
        assert_eq!(trials.body["trials"], all.body["trials"]);
        assert!(trials.body["trials"].as_array().map_or(0, Vec::len) >= 7);
        assert_eq!(forwarded(&bases).await, before);
    }
}

/// `augur worker` sent to the replica that does not own its busy study follows the owner the
/// first forwarded answer names: the worker's later changes go there, not through the hop.
/// When the owner dies, the worker's next change is refused by it (nothing sent) and goes to
/// `--url` again, which serves it: the worker finishes its trials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_follows_the_named_owner_and_comes_back_when_it_dies() {
    const TRIALS: usize = 8;
    let db = common::postgres_db().await;
    let (a, b) = two_routed(&db).await;
    let bases = [a.base.as_str(), b.base.as_str()];
    let mut spec = common::spec("random", 1000, 100);
    spec["name"] = json!("followed");
    let created = call(&a.base, Method::POST, "/v1/studies", Some(spec)).await;
    let study = created.body["id"].as_i64().expect("study id");
    let router = router_of(bases, study).await.to_string();
    let (owner, mut owner_process) = if router == a.base {
        (b.base.clone(), b)
    } else {
        (a.base.clone(), a)
    };
    // The bursts' trials end, and the budget leaves the worker TRIALS more (sent to the owner:
    // nothing here goes through the router).
    let trials = call(&owner, Method::GET, &routes::trials(study), None).await;
    let held = trials.body["trials"].as_array().expect("trials").clone();
    for trial in &held {
        let path = routes::trial_complete(study, &trial["id"]);
        let body = json!({"metrics": {"accuracy": 0.5}});
        let done = call(&owner, Method::POST, &path, Some(body)).await;
        assert_eq!(done.status, StatusCode::OK, "{:?}", done.body);
    }
    let all = held.len() + TRIALS;
    let budget = json!({"max_trials": all});
    let patched = call(&owner, Method::PATCH, &routes::study(study), Some(budget)).await;
    assert_eq!(patched.status, StatusCode::OK, "{:?}", patched.body);
    let forwarded_before = metric(&router, FORWARDED).await;

    let work = tempfile::tempdir().expect("dir");
    let script = work.path().join("trial.sh");
    std::fs::write(&script, "sleep 0.4\necho accuracy=0.7\n").expect("script");
    let worker = worker_command(
        &router,
        study,
        1,
        "follower",
        &work.path().join("out"),
        &script,
    )
    .env("AUGUR_TOKEN", ADMIN)
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("worker");
    // Half its trials through the owner; then the owner dies.
    let completed = |base: String| async move {
        let path = routes::study(study);
        let study = call(&base, Method::GET, &path, None).await;
        study.body["trial_counts"]["completed"]
            .as_u64()
            .unwrap_or(0) as usize
    };
    common::eventually("the worker's first trials", Duration::from_secs(60), || {
        let done = completed(router.clone());
        async move {
            let done = done.await;
            (done >= all - TRIALS / 2)
                .then_some(())
                .ok_or(format!("{done} completed"))
        }
    })
    .await;
    assert_eq!(
        metric(&router, FORWARDED).await,
        forwarded_before + 1.0,
        "only the worker's first change went through the router"
    );
    owner_process.kill();
    let log = worker_log(worker).await;
    assert_eq!(completed(router.clone()).await, all, "{log}");
    assert!(metric(&router, SERVED_HERE).await >= 1.0, "{log}");
}

/// A named owner that refuses connections is tried once: the worker's next changes go to
/// `--url` although every answer there names that owner again. (The owner is a stand-in row
/// in `replicas` whose port nothing listens on; its study's changes never overlap, so the
/// replica serves them itself and keeps naming it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_does_not_follow_again_an_owner_it_could_not_reach() {
    const TRIALS: usize = 4;
    let db = common::postgres_db().await;
    let a = routed(&db, &[]);
    a.wait_ready().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead = format!(
        "http://127.0.0.1:{}",
        closed.local_addr().expect("addr").port()
    );
    drop(closed);
    register_stand_in(&db, &dead).await;
    until_live(&[&a.base], 2.0).await;
    // A study the stand-in owns: a's answer to a change of it names the stand-in.
    let mut study = None;
    for candidate in create_studies(&a.base, 20).await {
        let (status, named) = suggest_naming_owner(&a.base, candidate).await;
        assert_eq!(status, StatusCode::OK);
        if named.as_deref() == Some(dead.as_str()) {
            study = Some(candidate);
            break;
        }
    }
    let study = study.expect("the stand-in owns one of 20 studies");
    // The probe's trial ends; the worker gets TRIALS more.
    let path = routes::trial_complete(study, 1);
    let done = call(
        &a.base,
        Method::POST,
        &path,
        Some(json!({"metrics": {"accuracy": 0.5}})),
    )
    .await;
    assert_eq!(done.status, StatusCode::OK, "{:?}", done.body);
    let budget = json!({"max_trials": 1 + TRIALS});
    let patched = call(&a.base, Method::PATCH, &routes::study(study), Some(budget)).await;
    assert_eq!(patched.status, StatusCode::OK, "{:?}", patched.body);

    let work = tempfile::tempdir().expect("dir");
    let script = work.path().join("trial.sh");
    std::fs::write(&script, "echo accuracy=0.7\n").expect("script");
    let worker = worker_command(
        &a.base,
        study,
        1,
        "refused",
        &work.path().join("out"),
        &script,
    )
    .env("AUGUR_TOKEN", ADMIN)
    .env("AUGUR_LOG", "warn,augur::cli::client=debug")
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("worker");
    let log = worker_log(worker).await;
    let tried = log.matches("study's replica unreachable").count();
    assert_eq!(
        tried, 1,
        "the unreachable owner was tried {tried} times:\n{log}"
    );
    let state = call(&a.base, Method::GET, &routes::study(study), None).await;
    assert_eq!(state.body["trial_counts"]["completed"], 1 + TRIALS, "{log}");
}

/// A replica killed outright (its lease still unexpired) refuses connections: the other
/// serves its studies' changes itself, at once, and every request is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_studies_are_served_by_the_others() {
    let db = common::postgres_db().await;
    let (a, mut b) = two_routed(&db).await;
    let studies = create_studies(&a.base, 20).await;
    // Every study hot at a: its changes to b's studies go to b.
    for &study in &studies {
        overlapping_suggests(&a.base, study, 3).await;
    }
    let before = metric(&a.base, FORWARDED).await;
    assert!(before > 0.0, "nothing was sent to b");
    b.kill();
    for &study in &studies {
        let answer = suggest(&a.base, study).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "study {study}: {:?}",
            answer.body
        );
    }
    // b owned some of the 20: the first of them found it gone, the rest were not tried.
    assert_eq!(metric(&a.base, SERVED_HERE).await, 1.0);
    assert_eq!(metric(&a.base, FORWARDED).await, before);
}

/// An owner that takes a forwarded change and fails before answering: the change may or may
/// not have been applied, so it is not served again here; the client gets 500 `unanswered`
/// naming the replica (not 503, which would tell it that sending it again is safe). (The owner here is a stand-in registered in the
/// `replicas` table: it reads each request and closes the connection.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_lost_by_its_owner_is_answered_unanswered_not_served_twice() {
    let db = common::postgres_db().await;
    let a = routed(&db, &[]);
    a.wait_ready().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
        }
    });
    register_stand_in(&db, &format!("http://127.0.0.1:{port}")).await;
    until_live(&[&a.base], 2.0).await;
    let studies = create_studies(&a.base, 20).await;
    let http = common::http();
    let mut lost = Vec::new();
    for &study in &studies {
        let path = routes::suggest(study);
        let answers = futures::future::join_all((0..3).map(|_| {
            common::call(
                &http,
                &a.base,
                Some(ADMIN),
                Method::POST,
                &path,
                Some(json!({"count": 1})),
            )
        }))
        .await;
        for answer in answers {
            match answer.status {
                StatusCode::OK => {}
                StatusCode::INTERNAL_SERVER_ERROR => lost.push(answer.body),
                other => panic!("study {study}: {other} {:?}", answer.body),
            }
        }
    }
    // The stand-in owns about half of the 20 studies.
    assert!(!lost.is_empty(), "no change reached the stand-in");
    for body in &lost {
        assert_eq!(body["error"]["code"], "unanswered", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains("replica serving this study"), "{body}");
    }
    let lost_here = metric(&a.base, "augur_forwarded_requests_total{outcome=\"lost\"}").await;
    assert_eq!(lost_here, lost.len() as f64);
    assert_eq!(
        metric(&a.base, SERVED_HERE).await,
        0.0,
        "a lost change was served again"
    );
}

/// A replica that stops (SIGTERM) leaves at once: the others stop routing to it without
/// waiting for its lease to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_replica_leaves_at_once() {
    let db = common::postgres_db().await;
    let (a, b) = two_routed(&db).await;
    let pid = nix::unistd::Pid::from_raw(b.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM sent");
    // Well inside the 10 s lease: only leaving makes it this quick.
    common::eventually("a sees b gone", Duration::from_secs(6), || async {
        let live = metric(&a.base, LIVE).await;
        if live == 1.0 {
            Ok(())
        } else {
            Err(format!("{live} live"))
        }
    })
    .await;
    drop(b);
}

/// The rate limit is taken once, where a request arrives: a forwarded request does not
/// count again at its owner, and a client cannot skip the limit with a made-up replica header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_is_taken_once_and_a_forged_replica_header_does_not_skip_it() {
    let db = common::postgres_db().await;
    // Three requests a second, bursts of six.
    let a = routed(&db, &["--rate-limit", "3"]);
    a.wait_ready().await;
    let b = routed(&db, &["--rate-limit", "3"]);
    b.wait_ready().await;
    until_live(&[&a.base, &b.base], 2.0).await;
    let studies = create_studies_paced(&a.base, 8, Duration::from_millis(400)).await;
    // A study b owns: three suggests at once to a, until a sends one on. Rounds over the
    // studies, since on a busy machine requests sent together may not overlap at a; each
    // try takes four of a's requests and waits for 4.5 to refill.
    let mut owned_by_b = None;
    let mut forwarded_so_far = metric(&a.base, FORWARDED).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for &study in studies.iter().cycle() {
        if owned_by_b.is_some() || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        overlapping_suggests(&a.base, study, 3).await;
        let now = metric(&a.base, FORWARDED).await;
        if now > forwarded_so_far {
            owned_by_b = Some(study);
        }
        forwarded_so_far = now;
    }
    let study = owned_by_b.expect("b owns one of 8 studies, and a sent one of its changes on");
    // a's bucket refills; the study stays hot at a (10 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = metric(&a.base, FORWARDED).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // a's burst, all sent on to b.
    for _ in 0..6 {
        assert_eq!(suggest(&a.base, study).await.status, StatusCode::OK);
    }
    // b's own burst is whole: what a sent on did not count at b.
    for _ in 0..6 {
        let answer = suggest(&b.base, study).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "b counted forwarded requests: {:?}",
            answer.body
        );
    }
    // b's burst is spent now; a made-up secret is a client's request like any other: sent
    // faster than b's three a second, they are refused (were the header trusted, none would).
    let http = common::http();
    let mut refused = 0;
    for _ in 0..12 {
        let forged = http
            .post(b.url(&routes::suggest(study)))
            .bearer_auth(ADMIN)
            .header("x-augur-replica", "augur_not-the-secret")
            .json(&json!({"count": 1}))
            .send()
            .await
            .expect("sent");
        if forged.status() == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
    }
    assert!(
        refused > 0,
        "b admitted 12 requests at once with a made-up replica header"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        metric(&a.base, FORWARDED).await,
        before + 6.0,
        "a's burst went to b"
    );
}

/// `--replica-url` must be a URL other replicas can reach.
#[tokio::test]
async fn a_replica_url_that_is_not_http_is_refused_at_start() {
    let db = common::sqlite_db();
    let mut config = augur::ServerConfig::new(db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
    config.replica_url = Some("ftp://example.com".into());
    match augur::App::build(config).await {
        Err(e) => assert!(e.to_string().contains("--replica-url"), "{e}"),
        Ok(_) => panic!("an ftp replica URL was accepted"),
    }
}

/// Vertex's Vizier routes are routed as the REST API's study routes are: once a Vizier
/// study's changes overlap at the replica that does not own it, that replica sends them to
/// the owner (naming it in the answer), and the owner serves its own; reads stay where they
/// arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vizier_changes_of_a_study_go_to_its_owner() {
    let db = common::postgres_db().await;
    let (a, b) = two_routed(&db).await;
    let bases = [a.base.as_str(), b.base.as_str()];
    let created = call(
        &a.base,
        Method::POST,
        &vizier::studies("projects/demo/locations/us-central1"),
        Some(json!({"displayName": "vizier-routed", "studySpec": {
            "metrics": [{"metricId": "acc", "goal": "MAXIMIZE"}],
            "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1}}],
            "algorithm": "RANDOM_SEARCH",
        }})),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.body);
    let name = created.body["name"].as_str().expect("name").to_string();
    let suggest_path = vizier::suggest_trials(&name);
    let http = common::http();
    let mut clients = 0;
    // Three Vizier suggests at once to one replica, then the other, until one sends on.
    let mut router = None;
    'rounds: for _ in 0..5 {
        for base in bases {
            let before = metric(base, FORWARDED).await;
            let answers = futures::future::join_all((0..3).map(|_| {
                clients += 1;
                common::call(
                    &http,
                    base,
                    Some(ADMIN),
                    Method::POST,
                    &suggest_path,
                    Some(json!({"suggestionCount": 1, "clientId": format!("w{clients}")})),
                )
            }))
            .await;
            for answer in answers {
                assert_eq!(answer.status, StatusCode::OK, "{base}: {:?}", answer.body);
                assert_eq!(answer.body["done"], true, "{:?}", answer.body);
            }
            if metric(base, FORWARDED).await > before {
                router = Some(base);
                break 'rounds;
            }
        }
    }
    let router = router.expect("a replica sent the Vizier study's changes on");
    let owner = if router == a.base { &b.base } else { &a.base };
    // The router now sends each change on and names the owner; the owner serves its own.
    let (router_before, owner_before) = (
        metric(router, FORWARDED).await,
        metric(owner, FORWARDED).await,
    );
    let answer = http
        .post(format!("{router}{suggest_path}"))
        .bearer_auth(ADMIN)
        .json(&json!({"suggestionCount": 1, "clientId": "one-more"}))
        .send()
        .await
        .expect("sent");
    assert_eq!(answer.status(), StatusCode::OK);
    let named = answer
        .headers()
        .get(augur::model::request::STUDY_REPLICA_HEADER)
        .map(|v| v.to_str().expect("ASCII").to_string());
    assert_eq!(named.as_deref(), Some(owner.as_str()));
    assert_eq!(metric(router, FORWARDED).await, router_before + 1.0);
    assert_eq!(metric(owner, FORWARDED).await, owner_before);
    // A read is served where it arrives, and sees every trial the owner made.
    let before = metric(router, FORWARDED).await;
    let trials = call(router, Method::GET, &vizier::trials(&name), None).await;
    assert_eq!(trials.status, StatusCode::OK, "{:?}", trials.body);
    assert_eq!(
        trials.body["trials"].as_array().map_or(0, Vec::len),
        clients + 1,
        "{:?}",
        trials.body
    );
    assert_eq!(metric(router, FORWARDED).await, before);
}
