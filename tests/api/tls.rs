//! Optional TLS (`augur serve --tls-cert --tls-key`): a certificate made in the test with
//! rcgen, the API over HTTPS, plain HTTP refused on that port, and the CLI trusting the
//! server's own certificate with `--ca-cert`.

use crate::common;

use std::io::{Read, Write};
use std::time::Duration;

use augur::app::TlsFiles;
use augur::{App, ServerConfig};
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_is_served_over_tls_and_the_cli_trusts_a_given_certificate() {
    let dir = tempfile::tempdir().expect("dir");
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("certificate");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).expect("cert");
    std::fs::write(&key, made.signing_key.serialize_pem()).expect("key");

    let db = common::sqlite_db();
    let mut config = ServerConfig::new(db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
    config.token = Some("tls-admin".into());
    config.dispatch = false;
    config.tls = Some(TlsFiles {
        cert: cert.clone(),
        key,
    });
    let app = App::build(config).await.expect("server");
    let port = app.addr().port();
    tokio::spawn(app.run());

    let trusted = common::http_builder()
        .tls_certs_only([reqwest::Certificate::from_pem(made.cert.pem().as_bytes()).expect("pem")])
        .build()
        .expect("client");
    let r = trusted
        .get(format!("https://localhost:{port}/v1/studies"))
        .bearer_auth("tls-admin")
        .send()
        .await
        .expect("https request");
    assert_eq!(r.status(), StatusCode::OK);
    // A client that does not trust the certificate cannot talk to it.
    assert!(
        common::http()
            .get(format!("https://localhost:{port}/healthz"))
            .send()
            .await
            .is_err(),
        "an untrusted certificate was accepted"
    );
    // Plain HTTP gets no answer from a TLS port.
    let plain = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await
    .expect("join");
    assert!(!plain.contains("200 OK"), "{plain}");

    // The CLI, with the server's certificate.
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(common::augur_bin())
            .args([
                "study",
                "list",
                "--url",
                &format!("https://localhost:{port}"),
            ])
            .arg("--ca-cert")
            .arg(&cert)
            .env("AUGUR_TOKEN", "tls-admin")
            .output()
            .expect("run augur")
    })
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("name"));
}

/// On a TLS server the login cookie is `Secure` (a browser never sends the token over plain
/// HTTP, e.g. to a look-alike `http://` link) and every answer carries HSTS, so the browser
/// keeps to HTTPS; a plain server sends neither (there, HSTS would be ignored and `Secure`
/// would lose the cookie).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_server_sets_a_secure_cookie_and_hsts() {
    let dir = tempfile::tempdir().expect("dir");
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).expect("cert");
    std::fs::write(&key, made.signing_key.serialize_pem()).expect("key");
    let db = common::sqlite_db();
    let mut config = ServerConfig::new(db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
    config.token = Some("tls-admin-token".into());
    config.dispatch = false;
    config.tls = Some(TlsFiles { cert, key });
    let app = App::build(config).await.expect("server");
    let port = app.addr().port();
    tokio::spawn(app.run());
    let client = common::http_builder()
        .tls_certs_only([reqwest::Certificate::from_pem(made.cert.pem().as_bytes()).expect("pem")])
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let login = client
        .post(format!("https://localhost:{port}/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("token=tls-admin-token&next=/")
        .send()
        .await
        .expect("login");
    assert_eq!(login.status(), StatusCode::SEE_OTHER);
    let cookie = login.headers()["set-cookie"].to_str().expect("cookie");
    assert!(cookie.contains("; Secure"), "{cookie}");
    for path in ["/healthz", "/v1/studies", "/login"] {
        let r = client
            .get(format!("https://localhost:{port}{path}"))
            .send()
            .await
            .expect("get");
        let hsts = r
            .headers()
            .get("strict-transport-security")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(hsts.starts_with("max-age="), "{path}: {hsts:?}");
    }

    let plain = common::spawn_app_with(common::sqlite_db(), Some("plain-admin-token")).await;
    let r = plain
        .http
        .get(format!("{}/healthz", plain.base))
        .send()
        .await
        .expect("get");
    assert!(r.headers().get("strict-transport-security").is_none());
}
