//! `augur trial exec` and `augur trial shell` through the server into a running trial's
//! replica (issue 31): a command's stdout, stderr, stdin and exit status in a local trial;
//! the refusals (a reader, another operator's study, a finished trial, an ask/tell trial);
//! each session in the audit trail.

use crate::common::{self, routes};

use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

const ADMIN: &str = "exec-admin-token";

/// A trial that runs until a file appears in its model directory (which a session makes,
/// ending it), then reports its metric.
fn waiting_trainer() -> Value {
    json!([
        "/bin/sh",
        "-c",
        "echo started; while [ ! -f \"$AIP_MODEL_DIR/done\" ]; do sleep 0.1; done; echo loss=1"
    ])
}

fn study_spec(name: &str, runs: &std::path::Path, command: Value) -> Value {
    json!({
        "name": name,
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": 1,
        "parallel_trials": 1,
        "seed": 1,
        "trial_job": {"command": command, "output_dir": runs.display().to_string()}
    })
}

/// `augur` with `args` and `token` against `url`, `stdin` fed to it: (status, stdout,
/// stderr).
pub async fn augur_with(
    url: &str,
    token: &str,
    args: &[&str],
    stdin: &str,
) -> (Option<i32>, String, String) {
    augur_env(url, token, args, stdin, &[]).await
}

/// `augur_with`, with more variables in `augur`'s environment (`AUGUR_CA_CERT`).
pub async fn augur_env(
    url: &str,
    token: &str,
    args: &[&str],
    stdin: &str,
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let (url, token, stdin) = (url.to_string(), token.to_string(), stdin.to_string());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(common::augur_bin())
            .args(&args)
            .env("AUGUR_URL", &url)
            .env("AUGUR_TOKEN", &token)
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run augur");
        // Written from a thread of its own, while the output is read: a big input must not
        // wait for the output to be read, nor the reverse.
        let writer = child.stdin.take().map(|mut input| {
            std::thread::spawn(move || {
                let _ = input.write_all(stdin.as_bytes());
            })
        });
        let out = child.wait_with_output().expect("augur output");
        if let Some(writer) = writer {
            let _ = writer.join();
        }
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .expect("join")
}

/// A token of `role` named `name`, made by the admin.
pub async fn token(app: &common::TestApp, name: &str, role: &str) -> String {
    let r = app
        .post("/v1/tokens", json!({"name": name, "role": role}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r.body["token"].as_str().expect("token").to_string()
}

/// Wait until `augur trial exec … -- true` gets into the trial (its job has started).
pub async fn until_exec_works(url: &str, token: &str, study: i64, trial: i64) {
    let (study, trial) = (study.to_string(), trial.to_string());
    common::eventually(
        "a session opens in the trial",
        Duration::from_secs(30),
        || async {
            let (code, out, err) = augur_with(
                url,
                token,
                &["trial", "exec", &study, &trial, "--", "true"],
                "",
            )
            .await;
            if code == Some(0) {
                Ok(())
            } else {
                Err(format!("{code:?} {out} {err}"))
            }
        },
    )
    .await;
}

on_both_backends!(exec_runs_a_command_in_a_running_local_trial_and_refuses_the_rest);

async fn exec_runs_a_command_in_a_running_local_trial_and_refuses_the_rest(backend: &str) {
    let app = common::spawn_app_with(common::db(backend).await, Some(ADMIN)).await;
    let owner = token(&app, "owner", "operator").await;
    let other = token(&app, "other-operator", "operator").await;
    let reader = token(&app, "reader", "reader").await;
    let runs = tempfile::tempdir().expect("runs");
    let url = app.base.clone();

    let created = common::call(
        &app.http,
        &app.base,
        Some(&owner),
        reqwest::Method::POST,
        "/v1/studies",
        Some(study_spec("exec", runs.path(), waiting_trainer())),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let study = created.body["id"].as_i64().expect("id");
    let s = study.to_string();
    until_exec_works(&url, &owner, study, 1).await;

    // Its output, its errors, its status; in the trial's environment and directory.
    let (code, out, err) = augur_with(
        &url,
        &owner,
        &[
            "trial", "exec", &s, "1", "--", "/bin/sh", "-c",
            "echo out-$AUGUR_TRIAL_ID; echo err-$AUGUR_STUDY_ID >&2; ls \"$AIP_MODEL_DIR/..\"; exit 7",
        ],
        "",
    )
    .await;
    assert_eq!(code, Some(7), "{out} {err}");
    assert!(out.contains("out-1\n"), "{out}");
    assert!(out.contains("model\n"), "the trial's directories: {out}");
    assert_eq!(err.trim(), format!("err-{study}"), "{err}");
    // Its stdin, to its end.
    let (code, out, err) = augur_with(
        &url,
        &owner,
        &["trial", "exec", &s, "1", "--", "cat"],
        "hello\nthere",
    )
    .await;
    assert_eq!((code, out.as_str()), (Some(0), "hello\nthere"), "{err}");
    // More than the pipes and channels between hold, both ways at once: a command that
    // writes its output before it reads its input gets the input all the same.
    let big: String = (0..300_000).map(|i| format!("line {i}\n")).collect();
    let args = [
        "trial",
        "exec",
        &s,
        "1",
        "--",
        "/bin/sh",
        "-c",
        "head -c 8000000 /dev/zero; cat",
    ];
    let both = augur_with(&url, &owner, &args, &big);
    let (code, out, err) = tokio::time::timeout(Duration::from_secs(60), both)
        .await
        .expect("the data flows both ways at once (no deadlock)");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.len(), 8_000_000 + big.len());
    assert!(out.ends_with(&big), "the input came back changed");
    // An admin may too.
    let (code, _, err) =
        augur_with(&url, ADMIN, &["trial", "exec", &s, "1", "--", "true"], "").await;
    assert_eq!(code, Some(0), "{err}");

    // Refused: a reader (its role), another operator (not the study's creator), an unknown
    // replica, a command that cannot start.
    let (code, _, err) =
        augur_with(&url, &reader, &["trial", "exec", &s, "1", "--", "true"], "").await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("403"), "{err}");
    let (code, _, err) =
        augur_with(&url, &other, &["trial", "exec", &s, "1", "--", "true"], "").await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("403") && err.contains("owner"), "{err}");
    let (code, _, err) = augur_with(
        &url,
        &owner,
        &[
            "trial",
            "exec",
            &s,
            "1",
            "--replica",
            "workerpool1-0",
            "--",
            "true",
        ],
        "",
    )
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("400 (replica)"), "{err}");
    let (code, _, err) = augur_with(
        &url,
        &owner,
        &["trial", "exec", &s, "1", "--", "/no/such/program"],
        "",
    )
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("409") && err.contains("/no/such/program"),
        "{err}"
    );

    // A session may end the trial (the file its trainer waits for); then it is finished, and
    // refused with the field that says why.
    let (code, _, err) = augur_with(
        &url,
        &owner,
        &[
            "trial",
            "exec",
            &s,
            "1",
            "--",
            "/bin/sh",
            "-c",
            "touch \"$AIP_MODEL_DIR/done\"",
        ],
        "",
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    app.wait_for_state(study, "completed", Duration::from_secs(30))
        .await;
    let (code, _, err) =
        augur_with(&url, &owner, &["trial", "exec", &s, "1", "--", "true"], "").await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("409 (state)") && err.contains("completed"),
        "{err}"
    );

    // An ask/tell trial runs where its client runs it: refused, saying so.
    let mut asked = common::spec("random", 3, 1);
    asked["name"] = json!("ask-tell");
    let created = common::call(
        &app.http,
        &app.base,
        Some(&owner),
        reqwest::Method::POST,
        "/v1/studies",
        Some(asked),
    )
    .await;
    let ask_tell = created.body["id"].as_i64().expect("id");
    let suggested = common::call(
        &app.http,
        &app.base,
        Some(&owner),
        reqwest::Method::POST,
        &routes::suggest(ask_tell),
        Some(json!({"count": 1})),
    )
    .await;
    assert_eq!(suggested.status, StatusCode::OK, "{}", suggested.body);
    let (code, _, err) = augur_with(
        &url,
        &owner,
        &["trial", "exec", &ask_tell.to_string(), "1", "--", "true"],
        "",
    )
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("409 (trial)") && err.contains("not run by this server's dispatcher"),
        "{err}"
    );

    // Every session opened is in the audit trail, with who, where and what.
    let audit = app.get("/v1/audit").await;
    assert_eq!(audit.status, StatusCode::OK, "{}", audit.body);
    let sessions: Vec<&Value> = audit.body["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["action"] == "trial.exec")
        .collect();
    assert!(sessions.len() >= 4, "{sessions:?}");
    assert!(
        sessions.iter().any(|e| e["actor"] == "owner"
            && e["study_id"] == study
            && e["trial_id"] == 1
            && e["detail"]
                .as_str()
                .is_some_and(|d| d.contains("workerpool0-0 exec") && d.contains("cat"))),
        "{sessions:?}"
    );
    assert!(sessions.iter().any(|e| e["actor"] == "env"), "{sessions:?}");
    assert!(
        !sessions
            .iter()
            .any(|e| e["actor"] == "reader" || e["actor"] == "other-operator"),
        "refused sessions are not sessions: {sessions:?}"
    );
}

/// A raw session over the WebSocket, as `augur trial shell` holds it: what came back so far.
struct RawSession {
    socket: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    seen: String,
}

impl RawSession {
    async fn open(app: &common::TestApp, token: &str, study: i64, start: Value) -> RawSession {
        use futures::SinkExt;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let url = format!("ws://{}{}", app.addr, routes::trial_exec(study, 1));
        let mut request = url.into_client_request().expect("request");
        request.headers_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
        let tcp = tokio::net::TcpStream::connect(app.addr).await.expect("tcp");
        let (mut socket, _) = tokio_tungstenite::client_async(request, tcp)
            .await
            .expect("upgrade");
        let start = tokio_tungstenite::tungstenite::Message::text(start.to_string());
        socket.send(start).await.expect("start");
        RawSession {
            socket,
            seen: String::new(),
        }
    }

    async fn send_text(&mut self, text: &str) {
        use futures::SinkExt;
        let message = tokio_tungstenite::tungstenite::Message::binary(text.as_bytes().to_vec());
        self.socket.send(message).await.expect("send");
    }

    async fn control(&mut self, control: Value) {
        use futures::SinkExt;
        let message = tokio_tungstenite::tungstenite::Message::text(control.to_string());
        self.socket.send(message).await.expect("send");
    }

    /// Read until the output holds `needle` (within 15 s); keep only what follows it.
    async fn expect(&mut self, needle: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while !self.seen.contains(needle) {
            match tokio::time::timeout_at(deadline, self.next()).await {
                Ok(Some(Ok(bytes))) => self.seen.push_str(&String::from_utf8_lossy(&bytes)),
                Ok(Some(Err(end))) => {
                    panic!("session ended ({end}) before {needle:?}: {}", self.seen)
                }
                Ok(None) => panic!("session closed before {needle:?}: {}", self.seen),
                Err(_) => panic!("no {needle:?} within 15 s: {:?}", self.seen),
            }
        }
        if let Some(at) = self.seen.find(needle) {
            self.seen = self.seen[at + needle.len()..].to_string();
        }
    }

    /// The next output (stdout, tag 1), or the session's last text message as `Err`.
    async fn next(&mut self) -> Option<Result<Vec<u8>, Value>> {
        use futures::StreamExt;
        use tokio_tungstenite::tungstenite::Message;
        loop {
            match self.socket.next().await? {
                Ok(Message::Binary(data)) => {
                    assert_eq!(data.first(), Some(&1), "a terminal has stdout only");
                    return Some(Ok(data[1..].to_vec()));
                }
                Ok(Message::Text(text)) => {
                    return Some(Err(serde_json::from_str(text.as_str()).expect("JSON")));
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// The session's end: its `exit` message.
    async fn exit(&mut self) -> Value {
        loop {
            match tokio::time::timeout(Duration::from_secs(15), self.next()).await {
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(end))) => return end,
                Ok(None) => panic!("closed without an exit"),
                Err(_) => panic!("no exit within 15 s"),
            }
        }
    }
}

/// A shell on a pseudo-terminal: typed into, it is a terminal of the size asked, resized,
/// Ctrl-C interrupts its foreground job (the shell lives on), and its exit status ends the
/// session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_on_a_terminal_is_typed_into_resized_and_interrupted() {
    let app = common::spawn_app_with(common::sqlite_db(), Some(ADMIN)).await;
    let runs = tempfile::tempdir().expect("runs");
    let study = app
        .create_study(study_spec("shell", runs.path(), waiting_trainer()))
        .await;
    until_exec_works(&app.base, ADMIN, study, 1).await;

    let start = json!({"command": ["/bin/sh"], "tty": true, "rows": 30, "cols": 100});
    let mut shell = RawSession::open(&app, ADMIN, study, start).await;
    shell.send_text("echo \"tty: $(tty)\"; stty size\n").await;
    shell.expect("tty: /dev/pts/").await;
    shell.expect("30 100").await;
    shell
        .control(json!({"type": "resize", "rows": 40, "cols": 120}))
        .await;
    shell
        .send_text("stty size; echo \"trial $AUGUR_TRIAL_ID\"\n")
        .await;
    shell.expect("40 120").await;
    shell.expect("trial 1").await;
    // Ctrl-C, typed: the terminal interrupts the sleep, the shell goes on.
    shell.send_text("sleep 100; echo \"slept $?\"\n").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    shell.send_text("\u{3}").await;
    shell.send_text("echo \"after $?\"\n").await;
    shell.expect("after 130").await;
    assert!(!shell.seen.contains("slept 0"), "{}", shell.seen);
    shell.send_text("exit 3\n").await;
    let end = shell.exit().await;
    assert_eq!(end, json!({"type": "exit", "code": 3, "signal": null}));

    // A session whose client goes away takes its command along.
    let start = json!({"command": ["/bin/sh", "-c", "echo $$ > \"$AIP_MODEL_DIR/shell.pid\"; sleep 100"], "tty": true});
    let shell = RawSession::open(&app, ADMIN, study, start).await;
    let pid_file = common::study_dir(runs.path(), study).join("1/model/shell.pid");
    let pid: i32 = common::eventually("the shell's pid", Duration::from_secs(15), || async {
        std::fs::read_to_string(&pid_file)
            .map_err(|e| e.to_string())
            .and_then(|t| {
                t.trim()
                    .parse()
                    .map_err(|e: std::num::ParseIntError| e.to_string())
            })
    })
    .await;
    assert!(common::alive(pid));
    drop(shell);
    common::eventually(
        "the shell gone with its client",
        Duration::from_secs(15),
        || async {
            if common::alive(pid) {
                Err(format!("{pid} alive"))
            } else {
                Ok(())
            }
        },
    )
    .await;

    // The dashboard's cookie rides along on a page's requests: it never opens a session.
    let refused = upgrade_with(&app, &[("cookie", &format!("augur_token={ADMIN}"))], study).await;
    assert_eq!(refused, Some(401));
    let refused = upgrade_with(
        &app,
        &[
            ("authorization", &format!("Bearer {ADMIN}")),
            ("origin", "http://evil.example"),
        ],
        study,
    )
    .await;
    assert_eq!(refused, Some(403), "a page of another origin");

    std::fs::write(
        common::study_dir(runs.path(), study).join("1/model/done"),
        "",
    )
    .expect("done");
    app.wait_for_state(study, "completed", Duration::from_secs(30))
        .await;
}

/// The status a WebSocket upgrade to trial 1's exec route with `headers` is refused with
/// (`None`: it was accepted).
async fn upgrade_with(app: &common::TestApp, headers: &[(&str, &str)], study: i64) -> Option<u16> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("ws://{}{}", app.addr, routes::trial_exec(study, 1));
    let mut request = url.into_client_request().expect("request");
    for (name, value) in headers {
        let name: tokio_tungstenite::tungstenite::http::HeaderName = name.parse().expect("name");
        request
            .headers_mut()
            .insert(name, value.parse().expect("value"));
    }
    let tcp = tokio::net::TcpStream::connect(app.addr).await.expect("tcp");
    match tokio_tungstenite::client_async(request, tcp).await {
        Ok(_) => None,
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            Some(response.status().as_u16())
        }
        Err(e) => panic!("upgrade: {e}"),
    }
}

/// An upgrade to trial 1's exec route with `headers`: the session and the server's
/// `Sec-WebSocket-Protocol`, or the refusal's status and JSON body.
async fn upgrade_answer(
    app: &common::TestApp,
    headers: &[(&str, &str)],
    study: i64,
) -> Result<
    (
        tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
        Option<String>,
    ),
    (u16, Value),
> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("ws://{}{}", app.addr, routes::trial_exec(study, 1));
    let mut request = url.into_client_request().expect("request");
    for (name, value) in headers {
        let name: tokio_tungstenite::tungstenite::http::HeaderName = name.parse().expect("name");
        request
            .headers_mut()
            .insert(name, value.parse().expect("value"));
    }
    let tcp = tokio::net::TcpStream::connect(app.addr).await.expect("tcp");
    match tokio_tungstenite::client_async(request, tcp).await {
        Ok((socket, response)) => {
            let selected = response
                .headers()
                .get("sec-websocket-protocol")
                .map(|v| v.to_str().expect("ASCII").to_string());
            Ok((socket, selected))
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let body = response
                .body()
                .as_deref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or(Value::Null);
            Err((response.status().as_u16(), body))
        }
        Err(e) => panic!("upgrade: {e}"),
    }
}

/// The subprotocols a browser offers for `token` (the dashboard's terminal, `terminal.js`).
fn offered(token: &str) -> String {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token);
    format!("augur.exec, base64url.bearer.augur.{encoded}")
}

/// A browser cannot set Authorization on a WebSocket: the exec route takes the token from a
/// subprotocol (`base64url.bearer.augur.<token>`), checked as a bearer token is (a reader's
/// refused 403, a malformed one 401 with a JSON error, the session audited as its owner's),
/// and the server selects `augur.exec`, never echoing the token. The cookie still opens
/// nothing, another origin is refused, an Authorization header wins over the subprotocol, and
/// no other route reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_offered_as_a_subprotocol_opens_a_session_as_a_bearer_token_would() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let app = common::spawn_app_with(common::sqlite_db(), Some(ADMIN)).await;
    let owner = token(&app, "owner", "operator").await;
    let reader = token(&app, "reader", "reader").await;
    let runs = tempfile::tempdir().expect("runs");
    let created = common::call(
        &app.http,
        &app.base,
        Some(&owner),
        reqwest::Method::POST,
        "/v1/studies",
        Some(study_spec("subprotocol", runs.path(), waiting_trainer())),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let study = created.body["id"].as_i64().expect("id");
    until_exec_works(&app.base, &owner, study, 1).await;

    // The owner's token as a subprotocol: a session, `augur.exec` selected, in the trial.
    let owners = offered(&owner);
    let (mut socket, selected) =
        upgrade_answer(&app, &[("sec-websocket-protocol", &owners)], study)
            .await
            .expect("the owner's session opens");
    assert_eq!(selected.as_deref(), Some("augur.exec"));
    let start =
        json!({"command": ["/bin/sh", "-c", "echo trial-$AUGUR_TRIAL_ID-of-$AUGUR_STUDY_ID"]});
    socket
        .send(Message::text(start.to_string()))
        .await
        .expect("start");
    let mut out = Vec::new();
    let end = loop {
        let next = tokio::time::timeout(Duration::from_secs(15), socket.next())
            .await
            .expect("the session answers within 15 s");
        match next {
            Some(Ok(Message::Binary(data))) => out.extend_from_slice(&data[1..]),
            Some(Ok(Message::Text(text))) => {
                break serde_json::from_str::<Value>(text.as_str()).expect("JSON");
            }
            Some(Ok(_)) => {}
            other => panic!("closed without an exit: {other:?}"),
        }
    };
    assert_eq!(end, json!({"type": "exit", "code": 0, "signal": null}));
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!("trial-1-of-{study}\n")
    );

    // A reader's token is a reader's, wherever it comes in.
    let readers = offered(&reader);
    let refused = upgrade_answer(&app, &[("sec-websocket-protocol", &readers)], study).await;
    assert_eq!(refused.err().map(|(status, _)| status), Some(403));
    // Not base64url of a token (or two tokens): 401, as JSON.
    for malformed in [
        "augur.exec, base64url.bearer.augur.not*base64",
        "augur.exec, base64url.bearer.augur.",
        "augur.exec, base64url.bearer.augur.IA", // a space
    ] {
        let refused = upgrade_answer(&app, &[("sec-websocket-protocol", malformed)], study).await;
        let (status, body) = refused.expect_err(malformed);
        assert_eq!(status, 401, "{malformed}");
        assert_eq!(
            body["error"]["code"], "unauthenticated",
            "{malformed}: {body}"
        );
    }
    let twice = format!("{owners}, base64url.bearer.augur.YQ");
    let refused = upgrade_answer(&app, &[("sec-websocket-protocol", &twice)], study).await;
    assert_eq!(refused.err().map(|(status, _)| status), Some(401));
    // The cookie opens nothing, beside the bare subprotocol or alone.
    let cookie = format!("augur_token={ADMIN}");
    let refused = upgrade_answer(
        &app,
        &[
            ("cookie", &cookie),
            ("sec-websocket-protocol", "augur.exec"),
        ],
        study,
    )
    .await;
    assert_eq!(refused.err().map(|(status, _)| status), Some(401));
    // A page of another origin may not, whatever token it offers.
    let refused = upgrade_answer(
        &app,
        &[
            ("sec-websocket-protocol", &owners),
            ("origin", "http://evil.example"),
        ],
        study,
    )
    .await;
    assert_eq!(refused.err().map(|(status, _)| status), Some(403));
    // An Authorization header is the token when both come.
    let bearer = format!("Bearer {reader}");
    let refused = upgrade_answer(
        &app,
        &[
            ("authorization", &bearer),
            ("sec-websocket-protocol", &owners),
        ],
        study,
    )
    .await;
    assert_eq!(refused.err().map(|(status, _)| status), Some(403));
    // Only the exec route reads a subprotocol.
    let other_route = app
        .http
        .get(app.url(&routes::study(study)))
        .header("sec-websocket-protocol", &owners)
        .send()
        .await
        .expect("GET");
    assert_eq!(other_route.status(), StatusCode::UNAUTHORIZED);

    // The session is in the audit trail as the owner's.
    let audit = app.get("/v1/audit").await;
    assert!(
        audit.body["events"]
            .as_array()
            .expect("events")
            .iter()
            .any(|e| e["action"] == "trial.exec"
                && e["actor"] == "owner"
                && e["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("trial-$AUGUR_TRIAL_ID"))),
        "{}",
        audit.body
    );
    std::fs::write(
        common::study_dir(runs.path(), study).join("1/model/done"),
        "",
    )
    .expect("done");
    app.wait_for_state(study, "completed", Duration::from_secs(30))
        .await;
}

/// A container trial: `podman exec` into the replica asked for (its own environment inside
/// its container), its status back, and a terminal through `podman exec --tty`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_reaches_each_replica_of_a_container_trial() {
    let (engine, image) = tokio::task::spawn_blocking(common::podman)
        .await
        .expect("podman");
    let app = common::spawn_app_configured(common::sqlite_db(), move |c| {
        c.token = Some(ADMIN.into());
        c.executors.containers = engine;
    })
    .await;
    let runs = tempfile::tempdir().expect("runs");
    let mut spec = study_spec("container", runs.path(), waiting_trainer());
    spec["trial_job"]["executor"] = json!("container");
    spec["trial_job"]["image"] = json!(image);
    spec["trial_job"]["worker_pools"] = json!([{"replicas": 1}, {"replicas": 1}]);
    let study = app.create_study(spec).await;
    let s = study.to_string();
    until_exec_works(&app.base, ADMIN, study, 1).await;

    for replica in ["workerpool0-0", "workerpool1-0"] {
        let (code, out, err) = augur_with(
            &app.base,
            ADMIN,
            &[
                "trial",
                "exec",
                &s,
                "1",
                "--replica",
                replica,
                "--",
                "/bin/sh",
                "-c",
                "echo \"$AUGUR_REPLICA in container\"; test -f /run/.containerenv && exit 5",
            ],
            "",
        )
        .await;
        assert_eq!(code, Some(5), "{out} {err}");
        assert_eq!(out, format!("{replica} in container\n"), "{err}");
    }
    let start = json!({"command": ["/bin/sh", "-c", "tty; stty size"], "tty": true, "rows": 20, "cols": 70, "replica": "workerpool1-0"});
    let mut shell = RawSession::open(&app, ADMIN, study, start).await;
    shell.expect("/dev/pts/").await;
    shell.expect("20 70").await;
    assert_eq!(shell.exit().await["code"], 0);

    std::fs::write(
        common::study_dir(runs.path(), study).join("1/model/done"),
        "",
    )
    .expect("done");
    app.wait_for_state(study, "completed", Duration::from_secs(60))
        .await;
}

/// A Slurm trial: a step of its own in the trial's job (`srun --overlap`), with the job's
/// environment and status; on a terminal with `--pty`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_a_step_in_a_slurm_trials_job() {
    crate::slurm::require_slurm();
    let app = common::spawn_app_with(common::sqlite_db(), Some(ADMIN)).await;
    let runs = tempfile::tempdir().expect("runs");
    let mut spec = study_spec("slurm", runs.path(), waiting_trainer());
    spec["trial_job"]["executor"] = json!("slurm");
    let study = app.create_study(spec).await;
    let s = study.to_string();
    until_exec_works(&app.base, ADMIN, study, 1).await;

    let (code, out, err) = augur_with(
        &app.base,
        ADMIN,
        &[
            "trial",
            "exec",
            &s,
            "1",
            "--",
            "/bin/sh",
            "-c",
            "echo \"trial $AUGUR_TRIAL_ID job $SLURM_JOB_ID\"; cat; exit 4",
        ],
        "typed\n",
    )
    .await;
    assert_eq!(code, Some(4), "{out} {err}");
    assert!(out.starts_with("trial 1 job "), "{out} {err}");
    assert!(out.ends_with("typed\n"), "{out} {err}");
    let start =
        json!({"command": ["/bin/sh", "-c", "tty; echo \"trial $AUGUR_TRIAL_ID\""], "tty": true});
    let mut shell = RawSession::open(&app, ADMIN, study, start).await;
    shell.expect("/dev/pts/").await;
    shell.expect("trial 1").await;
    assert_eq!(shell.exit().await["code"], 0);

    std::fs::write(
        common::study_dir(runs.path(), study).join("1/model/done"),
        "",
    )
    .expect("done");
    app.wait_for_state(study, "completed", Duration::from_secs(60))
        .await;
}

/// A Slurm cluster trial: a session in any replica runs as a step of the job on that
/// replica's node, with that replica's own environment (its `AUGUR_REPLICA` and its cluster
/// configuration with the allocation's hosts and ports filled in), on a terminal too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_reaches_each_replica_of_a_slurm_cluster_trial() {
    crate::slurm::require_slurm();
    let app = common::spawn_app_with(common::sqlite_db(), Some(ADMIN)).await;
    let runs = tempfile::tempdir().expect("runs");
    let mut spec = study_spec("slurm-cluster", runs.path(), waiting_trainer());
    spec["trial_job"]["executor"] = json!("slurm");
    spec["trial_job"]["worker_pools"] = json!([{"replicas": 1}, {"replicas": 1}]);
    let study = app.create_study(spec).await;
    let s = study.to_string();
    until_exec_works(&app.base, ADMIN, study, 1).await;

    let show = "echo \"$AUGUR_REPLICA on $(hostname) job $SLURM_JOB_ID\"; echo \"$CLUSTER_SPEC\"";
    let mut jobs = Vec::new();
    for replica in ["workerpool0-0", "workerpool1-0"] {
        let (code, out, err) = augur_with(
            &app.base,
            ADMIN,
            &[
                "trial",
                "exec",
                &s,
                "1",
                "--replica",
                replica,
                "--",
                "/bin/sh",
                "-c",
                show,
            ],
            "",
        )
        .await;
        assert_eq!(code, Some(0), "{out} {err}");
        let mut lines = out.lines();
        let first = lines.next().unwrap_or_default();
        let expected = format!("{replica} on {} job ", hostname());
        assert!(first.starts_with(&expected), "{out} {err}");
        jobs.push(first.rsplit(' ').next().unwrap_or_default().to_string());
        let cluster: Value = serde_json::from_str(lines.next().unwrap_or_default())
            .unwrap_or_else(|e| panic!("CLUSTER_SPEC {out}: {e}"));
        let text = cluster.to_string();
        assert!(!text.contains("__AUGUR_"), "placeholders left: {text}");
        assert!(text.contains(&hostname()), "{text}");
    }
    assert_eq!(jobs[0], jobs[1], "one job: {jobs:?}");
    let start = json!({"command": ["/bin/sh", "-c", "tty; echo \"in $AUGUR_REPLICA\""], "tty": true, "replica": "workerpool1-0"});
    let mut shell = RawSession::open(&app, ADMIN, study, start).await;
    shell.expect("/dev/pts/").await;
    shell.expect("in workerpool1-0").await;
    assert_eq!(shell.exit().await["code"], 0);
    let (code, _, err) = augur_with(
        &app.base,
        ADMIN,
        &[
            "trial",
            "exec",
            &s,
            "1",
            "--replica",
            "workerpool3-0",
            "--",
            "true",
        ],
        "",
    )
    .await;
    assert_ne!(code, Some(0));
    assert!(err.contains("(replica)"), "{err}");

    std::fs::write(
        common::study_dir(runs.path(), study).join("1/model/done"),
        "",
    )
    .expect("done");
    app.wait_for_state(study, "completed", Duration::from_secs(60))
        .await;
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("hostname")
        .trim()
        .to_string()
}

/// `augur trial shell` as a user runs it, on a terminal of its own (a PTY this test holds):
/// keys reach the remote shell as typed, the remote terminal has this one's size and follows
/// its resize (SIGWINCH), Ctrl-C interrupts the remote command, not `augur`, and `augur`
/// exits with the shell's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn augur_trial_shell_on_a_terminal_passes_keys_size_and_ctrl_c_through() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = common::spawn_app_with(common::sqlite_db(), Some(ADMIN)).await;
    let runs = tempfile::tempdir().expect("runs");
    let study = app
        .create_study(study_spec("cli-shell", runs.path(), waiting_trainer()))
        .await;
    until_exec_works(&app.base, ADMIN, study, 1).await;

    let (pty, pts) = pty_process::open().expect("a pty");
    pty.resize(pty_process::Size::new(30, 100)).expect("size");
    let mut augur = pty_process::Command::new(common::augur_bin())
        .args(["trial", "shell", &study.to_string(), "1", "--", "/bin/sh"])
        .env("AUGUR_URL", &app.base)
        .env("AUGUR_TOKEN", ADMIN)
        .kill_on_drop(true)
        .spawn(pts)
        .expect("augur trial shell");
    let (mut reader, mut writer) = pty.into_split();
    let (tx, mut screen) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = reader.read(&mut buf).await {
            if n == 0
                || tx
                    .send(String::from_utf8_lossy(&buf[..n]).into_owned())
                    .is_err()
            {
                return;
            }
        }
    });
    let mut seen = String::new();
    let mut expect = async |needle: &str| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while !seen.contains(needle) {
            match tokio::time::timeout_at(deadline, screen.recv()).await {
                Ok(Some(text)) => seen.push_str(&text),
                _ => panic!("no {needle:?} on the terminal: {seen:?}"),
            }
        }
        let at = seen.find(needle).map_or(0, |i| i + needle.len());
        seen = seen[at..].to_string();
    };

    writer
        .write_all(b"stty size; echo \"in trial $AUGUR_TRIAL_ID\"\n")
        .await
        .expect("type");
    expect("30 100").await;
    expect("in trial 1").await;
    writer
        .resize(pty_process::Size::new(41, 120))
        .expect("resize");
    // The resize travels as SIGWINCH here, then a control message there.
    tokio::time::sleep(Duration::from_millis(500)).await;
    writer.write_all(b"stty size\n").await.expect("type");
    expect("41 120").await;
    writer
        .write_all(b"sleep 100; echo \"slept $?\"\n")
        .await
        .expect("type");
    tokio::time::sleep(Duration::from_millis(500)).await;
    writer.write_all(b"\x03").await.expect("Ctrl-C");
    writer
        .write_all(b"echo \"after $?\"\n")
        .await
        .expect("type");
    expect("after 130").await;
    writer.write_all(b"exit 4\n").await.expect("type");
    let status = tokio::time::timeout(Duration::from_secs(15), augur.wait())
        .await
        .expect("augur ends with the shell")
        .expect("status");
    assert_eq!(status.code(), Some(4));

    std::fs::write(
        common::study_dir(runs.path(), study).join("1/model/done"),
        "",
    )
    .expect("done");
    app.wait_for_state(study, "completed", Duration::from_secs(30))
        .await;
}

/// Over HTTPS (`wss://`), the CLI trusts the server's own certificate with `--ca-cert`
/// (`AUGUR_CA_CERT`), as its other commands do, and refuses it without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_tls_trusts_the_certificate_given() {
    let dir = tempfile::tempdir().expect("dir");
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).expect("cert");
    std::fs::write(&key, made.signing_key.serialize_pem()).expect("key");
    let app = common::spawn_app_configured(common::sqlite_db(), {
        let (cert, key) = (cert.clone(), key.clone());
        move |c| {
            c.token = Some(ADMIN.into());
            c.tls = Some(augur::app::TlsFiles { cert, key });
        }
    })
    .await;
    let url = format!("https://localhost:{}", app.addr.port());
    let runs = tempfile::tempdir().expect("runs");
    let spec = dir.path().join("study.json");
    std::fs::write(
        &spec,
        study_spec("tls", runs.path(), waiting_trainer()).to_string(),
    )
    .expect("spec");
    let ca = cert.display().to_string();
    let trusted = [("AUGUR_CA_CERT", ca.as_str())];
    let spec = spec.display().to_string();
    let (code, out, err) =
        augur_env(&url, ADMIN, &["study", "create", "-f", &spec], "", &trusted).await;
    assert_eq!(code, Some(0), "{out} {err}");

    let args = [
        "trial",
        "exec",
        "1",
        "1",
        "--",
        "/bin/sh",
        "-c",
        "echo \"over tls $AUGUR_TRIAL_ID\"",
    ];
    let out = common::eventually("a session over TLS", Duration::from_secs(30), || async {
        match augur_env(&url, ADMIN, &args, "", &trusted).await {
            (Some(0), out, _) => Ok(out),
            (code, out, err) => Err(format!("{code:?} {out} {err}")),
        }
    })
    .await;
    assert_eq!(out, "over tls 1\n");
    let (code, _, err) = augur_env(&url, ADMIN, &args, "", &[]).await;
    assert_eq!(code, Some(1), "a certificate nobody vouches for: {err}");
    assert!(err.contains("TLS") || err.contains("certificate"), "{err}");

    std::fs::write(common::study_dir(runs.path(), 1).join("1/model/done"), "").expect("done");
}
