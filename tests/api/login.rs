//! The dashboard's login and logout as an attacker would try them (issue 10, findings 4 and
//! 5): an open redirect after login, a login forced from another site, a cookie whose
//! attributes come from the form, a token that was never checked.

use crate::common::{self, routes};

use std::time::Duration;

use augur::model::{StudyId, TrialId, TrialKey};
use reqwest::StatusCode;

const TOKEN: &str = "s3cret-token";

/// A client that shows redirects instead of following them, as a test must see them.
fn browser() -> reqwest::Client {
    common::http_builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

/// `POST /login` with a form body and extra headers; the status, `Location` and
/// `Set-Cookie`.
async fn post_login(
    app: &common::TestApp,
    form: &[(&str, &str)],
    headers: &[(&str, &str)],
) -> (StatusCode, Option<String>, Option<String>) {
    let body: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    let mut request = browser()
        .post(format!("{}/login", app.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let r = request.send().await.expect("post /login");
    let header = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    (r.status(), header("location"), header("set-cookie"))
}

/// The probe's redirect: browsers drop tabs and line breaks from URLs, so `/\t/evil.example`
/// becomes `//evil.example`, another site. Neither the form nor the redirect may carry it.
#[tokio::test]
async fn login_redirects_only_to_paths_of_this_server() {
    let app = common::spawn_app_with(common::sqlite_db(), Some(TOKEN)).await;
    for next in [
        "/\t/evil.example",
        "/\n/evil.example",
        "/\r/evil.example",
        "/ /evil.example",
        "/\\evil.example",
        "//evil.example",
        "https://evil.example",
        "/\u{0}/evil.example",
        "evil.example",
    ] {
        let (status, location, _) =
            post_login(&app, &[("token", TOKEN), ("next", next)], &[]).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{next:?}");
        assert_eq!(location.as_deref(), Some("/"), "next {next:?}");
    }
    // The form carries the same rule: a link to /login?next=… cannot plant a bad target.
    let page = browser()
        .get(format!("{}/login?next=/%09/evil.example", app.base))
        .send()
        .await
        .expect("login page")
        .text()
        .await
        .expect("text");
    assert!(
        page.contains(r#"name="next" value="/""#),
        "the form keeps a foreign target: {page}"
    );
    let (_, location, _) = post_login(
        &app,
        &[("token", TOKEN), ("next", "/studies/3?x=1&y=%2F")],
        &[],
    )
    .await;
    assert_eq!(location.as_deref(), Some("/studies/3?x=1&y=%2F"));
}

/// Login CSRF: a page may post a login form with the attacker's own token, so that the
/// victim's dashboard shows (and the victim feeds) the attacker's account. The token is
/// checked first, and a login posted from another site is refused.
#[tokio::test]
async fn login_sets_only_a_valid_token_and_only_from_this_site() {
    let app = common::spawn_app_with(common::sqlite_db(), Some(TOKEN)).await;
    let (status, _, cookie) = post_login(&app, &[("token", "not-a-token")], &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "an unknown token");
    assert_eq!(cookie, None, "no cookie for an unknown token");

    for headers in [
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![("origin", "http://evil.example")],
    ] {
        let (status, _, cookie) = post_login(&app, &[("token", TOKEN)], &headers).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{headers:?}");
        assert_eq!(cookie, None, "{headers:?}");
    }
    // The server's own page, and a user typing the form in (no Sec-Fetch-Site: older
    // browsers and scripts).
    for headers in [
        vec![("sec-fetch-site", "same-origin")],
        vec![("sec-fetch-site", "none")],
        vec![],
    ] {
        let (status, _, cookie) = post_login(&app, &[("token", TOKEN)], &headers).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{headers:?}");
        assert!(cookie.is_some(), "{headers:?}");
    }
}

/// Cookie attribute injection: `token=x; Domain=evil.example; Max-Age=…` must never reach the
/// `Set-Cookie` header: the cookie holds a checked token, whose characters are all a cookie
/// value may hold, and the attributes are the server's.
#[tokio::test]
async fn a_token_cannot_inject_cookie_attributes() {
    let app = common::spawn_app_with(common::sqlite_db(), Some(TOKEN)).await;
    for token in [
        format!("{TOKEN};Domain=evil.example"),
        format!("{TOKEN}; Max-Age=999999999"),
        format!("{TOKEN}\r\nSet-Cookie: x=y"),
        format!("{TOKEN},Path=/v1"),
    ] {
        let (status, _, cookie) = post_login(&app, &[("token", token.as_str())], &[]).await;
        assert_ne!(status, StatusCode::SEE_OTHER, "{token:?} signed in");
        assert_eq!(cookie, None, "{token:?}");
    }
    let (_, _, cookie) = post_login(&app, &[("token", TOKEN)], &[]).await;
    let cookie = cookie.expect("cookie");
    assert_eq!(
        cookie,
        format!("augur_token={TOKEN}; Path=/; HttpOnly; SameSite=Strict")
    );
}

/// A dispatched trial's token may report to its trial and nothing else: it is no login.
#[tokio::test]
async fn a_trial_token_cannot_sign_in() {
    let app = common::spawn_app_with(common::sqlite_db(), Some(TOKEN)).await;
    let study = app.create_study(common::spec("random", 3, 1)).await;
    app.post(&routes::suggest(study), serde_json::json!({}))
        .await;
    let store = augur::store::connect(&app.db.url).await.expect("store");
    store
        .insert_token(
            "trial:x",
            &augur::service::hash_token("trial-secret"),
            Some(TrialKey::new(StudyId::new(study), TrialId::new(1))),
            chrono::Utc::now(),
        )
        .await
        .expect("token");
    let (status, _, cookie) = post_login(&app, &[("token", "trial-secret")], &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(cookie, None);
}

/// `POST /logout` clears the cookie and goes back to the login form; from another site it
/// is refused like a login.
#[tokio::test]
async fn logout_clears_the_cookie() {
    let app = common::spawn_app_with(common::sqlite_db(), Some(TOKEN)).await;
    // Every page offers the sign-out, a form that posts to /logout.
    let page = browser()
        .get(format!("{}/", app.base))
        .header("cookie", "augur_token=s3cret-token")
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.expect("html");
    assert!(
        html.contains(r#"<form class="signout" method="post" action="/logout">"#),
        "{html}"
    );
    // An open server has no one to sign out.
    let open = common::spawn_app(common::sqlite_db()).await;
    let html = browser()
        .get(format!("{}/", open.base))
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    assert!(
        html.contains("<header class=\"top\">") && !html.contains("signout"),
        "{html}"
    );
    let logout = |headers: Vec<(&'static str, &'static str)>| {
        let base = app.base.clone();
        async move {
            let mut request = browser().post(format!("{base}/logout"));
            for (name, value) in headers {
                request = request.header(name, value);
            }
            request.send().await.expect("post /logout")
        }
    };
    let r = logout(vec![("cookie", "augur_token=s3cret-token")]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/login");
    let cookie = r.headers()["set-cookie"].to_str().expect("cookie");
    assert!(
        cookie.starts_with("augur_token=;") && cookie.contains("Max-Age=0"),
        "{cookie}"
    );
    let r = logout(vec![("sec-fetch-site", "cross-site")]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.headers().get("set-cookie").is_none());
}
