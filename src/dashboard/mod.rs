//! The web dashboard: HTML pages, a login form for token-protected servers, and the embedded
//! assets; each page a small shell that loads `main.js`, drawn from the JSON API.

use std::sync::LazyLock;

use crate::api::access::{Access, AccessRouter};
use crate::model::Role;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::routes;

use crate::api::AppState;
use crate::api::auth::TOKEN_COOKIE;
use crate::api::error::ApiError;
use crate::api::rate_limit::SourceAddress;

/// The dashboard's JavaScript modules by file name, each embedded at build time and served at
/// `/dashboard/js/{module}`; they import each other by these names. A unit test keeps this
/// list equal to the files in `assets/js/`. `include_str!` rather than rust-embed: a dozen
/// small files need no dependency, and debug builds serve the same bytes as release ones
/// (rust-embed reads the disk in debug builds).
const MODULES: &[(&str, &str)] = &[
    ("main.js", include_str!("assets/js/main.js")),
    ("annotations.js", include_str!("assets/js/annotations.js")),
    ("api.js", include_str!("assets/js/api.js")),
    ("charts.js", include_str!("assets/js/charts.js")),
    ("compare.js", include_str!("assets/js/compare.js")),
    ("csv.js", include_str!("assets/js/csv.js")),
    ("dom.js", include_str!("assets/js/dom.js")),
    ("live.js", include_str!("assets/js/live.js")),
    ("marks.js", include_str!("assets/js/marks.js")),
    ("pools.js", include_str!("assets/js/pools.js")),
    ("studies.js", include_str!("assets/js/studies.js")),
    ("study.js", include_str!("assets/js/study.js")),
    ("study-charts.js", include_str!("assets/js/study-charts.js")),
    ("table.js", include_str!("assets/js/table.js")),
    ("terminal.js", include_str!("assets/js/terminal.js")),
    ("trial.js", include_str!("assets/js/trial.js")),
];
/// Others' code the dashboard serves as its packages ship it (`assets/vendor/`, whose README
/// names each version and how to update it), at `/dashboard/vendor/{file}`: xterm.js and its
/// fit addon for the trial page's terminal (`terminal.js`), loaded when a terminal opens.
const VENDOR: &[(&str, &str, &str)] = &[
    (
        "xterm.js",
        include_str!("assets/vendor/xterm/xterm.js"),
        "text/javascript; charset=utf-8",
    ),
    (
        "addon-fit.js",
        include_str!("assets/vendor/xterm/addon-fit.js"),
        "text/javascript; charset=utf-8",
    ),
    (
        "xterm.css",
        include_str!("assets/vendor/xterm/xterm.css"),
        "text/css; charset=utf-8",
    ),
];
/// The module a page shell loads; it imports the rest.
const ENTRY_MODULE: &str = "main.js";
const STYLE_CSS: &str = include_str!("assets/style.css");
/// Bumped with the crate version, so browsers never keep a stale asset across upgrades.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// plotly.js as the `plotly` crate embeds it. The crate hands it out only inside
/// `<script>` tags together with MathJax; cut plotly's own script out once.
static PLOTLY_JS: LazyLock<String> =
    LazyLock::new(|| extract_plotly(&plotly::Plot::offline_js_sources()));

fn extract_plotly(sources: &str) -> String {
    const OPEN: &str = "<script type=\"text/javascript\">";
    let Some(start) = sources.find(OPEN).map(|i| i + OPEN.len()) else {
        return String::new();
    };
    // The second script (MathJax) starts after plotly's closing tag.
    let end = sources[start..]
        .find(OPEN)
        .and_then(|next| sources[start..start + next].rfind("</script>"))
        .map_or(sources.len(), |e| start + e);
    sources[start..end].to_string()
}

/// The web dashboard: HTML pages at `/`, `/studies/{study}`, `/studies/{study}/trials/{trial}`,
/// `/compare` and `/pools`, a login form for token-protected servers, and the embedded assets. Each
/// page is a small shell that loads `main.js`; the JavaScript modules of `assets/js/` (one per
/// page and per part, no build step, served from `MODULES`) draw it from the JSON API
/// (`/v1/...`, including the aggregates of `insights/charts.rs`) and keep the study page live
/// through the change cursor. Charts are plotly.js, which the `plotly` crate ships inside the
/// binary: no npm step. The trial page's terminal is xterm.js, its prebuilt bundle vendored
/// under `assets/vendor/` (`VENDOR`).
pub fn router() -> AccessRouter {
    // The pages show data: a reader's. The login form, sign-out and assets hold none (a
    // sign-in checks its token itself).
    let read = Access::Role(Role::Reader);
    AccessRouter::new()
        .routes(read, routes!(studies_page))
        .routes(read, routes!(study_page))
        .routes(read, routes!(trial_page))
        .routes(read, routes!(compare_page))
        .routes(read, routes!(pools_page))
        .routes(Access::Public, routes!(login_page, login))
        .routes(Access::Public, routes!(logout))
        .routes(Access::Public, routes!(js_module))
        .routes(Access::Public, routes!(style_css))
        .routes(Access::Public, routes!(plotly_js))
        .routes(Access::Public, routes!(vendor_file))
}

/// A page shell: `main.js` reads `data-*` from the body and draws the page.
/// A dashboard page's shell: `open` (a server without tokens) has no one to sign out.
fn page(open: bool, title: &str, kind: &str, data: &[(&str, i64)]) -> Html<String> {
    let sign_out = if open {
        ""
    } else {
        r#"<form class="signout" method="post" action="/logout"><button type="submit">Sign out</button></form>"#
    };
    let attrs: String = data
        .iter()
        .map(|(k, v)| format!(" data-{k}=\"{v}\""))
        .collect();
    // Every other module is fetched in parallel at once, rather than level by level as the
    // browser finds the imports (main → study → table → dom).
    let preloads: String = MODULES
        .iter()
        .filter(|(name, _)| *name != ENTRY_MODULE)
        .map(|(name, _)| format!("<link rel=\"modulepreload\" href=\"/dashboard/js/{name}\">\n"))
        .collect();
    Html(format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · Augur</title>
<link rel="stylesheet" href="/dashboard/style.css?v={VERSION}">
<script type="module" src="/dashboard/js/{ENTRY_MODULE}?v={VERSION}"></script>
{preloads}</head>
<body data-page="{kind}" data-version="{VERSION}"{attrs}>
<header class="top"><a class="brand" href="/">Augur</a><nav><a href="/">Studies</a><a href="/compare">Compare</a><a href="/pools">Pools</a></nav>{sign_out}</header>
<main id="main"><p class="muted">Loading…</p></main>
</body>
</html>
"#
    ))
}

fn not_found_page(what: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Html(format!(
            "<!doctype html><title>Not found · Augur</title><p>{what} not found. <a href=\"/\">All studies</a></p>"
        )),
    )
        .into_response()
}

fn positive_id(s: &str) -> Option<i64> {
    s.parse::<i64>().ok().filter(|&v| v > 0)
}

/// The studies page: every study with state, progress and best value; filter by state and
/// name (`?state=&name=`).
#[utoipa::path(get, path = "/", tag = "dashboard",
    responses(
        (status = 200, description = "The studies page", content_type = "text/html", body = String),
        (status = 303, description = "No valid token, from a browser: to the login form"),
        (status = 401, description = "No valid token, from a client that does not ask for HTML", body = crate::api::error::ErrorBody),
    ))]
pub async fn studies_page(State(state): State<AppState>) -> Html<String> {
    page(state.auth.open, "Studies", "studies", &[])
}

/// A study, live: optimization history, trial table, importance, parallel coordinates,
/// slices, contour and learning curves.
#[utoipa::path(get, path = "/studies/{study}", tag = "dashboard",
    params(("study" = String, Path, description = "study id")),
    responses(
        (status = 200, description = "The study page", content_type = "text/html", body = String),
        (status = 303, description = "No valid token, from a browser: to the login form"),
        (status = 401, description = "No valid token, from a client that does not ask for HTML", body = crate::api::error::ErrorBody),
        (status = 404, description = "Not a study id", content_type = "text/html", body = String),
    ))]
pub async fn study_page(State(state): State<AppState>, Path(study): Path<String>) -> Response {
    match positive_id(&study) {
        Some(id) => page(
            state.auth.open,
            &format!("Study {id}"),
            "study",
            &[("study", id)],
        )
        .into_response(),
        None => not_found_page("study"),
    }
}

/// One trial: parameters, measurements as a learning curve, model directory and logs.
#[utoipa::path(get, path = "/studies/{study}/trials/{trial}", tag = "dashboard",
    params(
        ("study" = String, Path, description = "study id"),
        ("trial" = String, Path, description = "trial id"),
    ),
    responses(
        (status = 200, description = "The trial page", content_type = "text/html", body = String),
        (status = 303, description = "No valid token, from a browser: to the login form"),
        (status = 401, description = "No valid token, from a client that does not ask for HTML", body = crate::api::error::ErrorBody),
        (status = 404, description = "Not a study or trial id", content_type = "text/html", body = String),
    ))]
pub async fn trial_page(
    State(state): State<AppState>,
    Path((study, trial)): Path<(String, String)>,
) -> Response {
    match (positive_id(&study), positive_id(&trial)) {
        (Some(s), Some(t)) => page(
            state.auth.open,
            &format!("Trial {t} of study {s}"),
            "trial",
            &[("study", s), ("trial", t)],
        )
        .into_response(),
        _ => not_found_page("trial"),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CompareQuery {
    /// Study ids separated by commas, e.g. `1,2`.
    #[expect(
        dead_code,
        reason = "read by compare.js from the URL; declared for the OpenAPI document"
    )]
    studies: Option<String>,
}

/// Studies side by side: best-so-far curves on one chart, best trials in one table.
#[utoipa::path(get, path = "/compare", tag = "dashboard", params(CompareQuery),
    responses(
        (status = 200, description = "The compare page", content_type = "text/html", body = String),
        (status = 303, description = "No valid token, from a browser: to the login form"),
        (status = 401, description = "No valid token, from a client that does not ask for HTML", body = crate::api::error::ErrorBody),
    ))]
pub async fn compare_page(State(state): State<AppState>) -> Html<String> {
    page(state.auth.open, "Compare", "compare", &[])
}

/// Worker pools: each pool's workers (slots and GPUs busy and idle, last seen), the
/// studies waiting for its slots, and its busy and idle slot-seconds per minute.
#[utoipa::path(get, path = "/pools", tag = "dashboard",
    responses(
        (status = 200, description = "The pools page", content_type = "text/html", body = String),
        (status = 303, description = "No valid token, from a browser: to the login form"),
        (status = 401, description = "No valid token, from a client that does not ask for HTML", body = crate::api::error::ErrorBody),
    ))]
pub async fn pools_page(State(state): State<AppState>) -> Html<String> {
    page(state.auth.open, "Pools", "pools", &[])
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LoginQuery {
    /// Where to go after signing in (a path on this server).
    next: Option<String>,
}

/// A form asking for an API token, for servers that require one.
#[utoipa::path(get, path = "/login", tag = "dashboard", params(LoginQuery),
    responses((status = 200, description = "The login form", content_type = "text/html", body = String)))]
pub async fn login_page(Query(q): Query<LoginQuery>) -> Html<String> {
    login_form(&safe_next(q.next.as_deref()), None)
}

fn login_form(next: &str, error: Option<&str>) -> Html<String> {
    let error = error
        .map(|e| format!("<p class=\"error\">{}</p>\n", html_escape(e)))
        .unwrap_or_default();
    Html(format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in · Augur</title>
<link rel="stylesheet" href="/dashboard/style.css?v={VERSION}"></head>
<body><main class="login"><h1>Augur</h1>
{error}<form method="post" action="/login">
<label>API token <input type="password" name="token" autocomplete="current-password" required autofocus></label>
<input type="hidden" name="next" value="{next}">
<button type="submit">Sign in</button>
</form>
<p class="muted">A token from <code>augur token create</code> or the server's <code>AUGUR_TOKEN</code>.</p>
</main></body></html>
"#,
        next = html_escape(next),
    ))
}

/// Check the token (through the service, as every request is), keep it in an HTTP-only
/// cookie (`Secure` when browsers reach this server over HTTPS) and go on to the page asked
/// for. The cookie is accepted for reading only (GET), so a forged cross-site form cannot
/// change anything; a login posted from another site is refused by the guard
/// (`api/guard.rs`: login CSRF, the victim would be signed in as the attacker). Failed
/// sign-ins count against the source address's limit (`api/rate_limit.rs`), like wrong
/// bearer tokens.
#[utoipa::path(post, path = "/login", tag = "dashboard",
    request_body(content = String, content_type = "application/x-www-form-urlencoded",
        description = "`token=<api token>&next=<path>`"),
    responses(
        (status = 303, description = "Signed in: the cookie is set, on to `next`"),
        (status = 400, description = "No token in the form, or one no cookie can hold", content_type = "text/html", body = String),
        (status = 401, description = "No such token (or it expired): the form again", content_type = "text/html", body = String),
        (status = 403, description = "Posted from another site, or a trial's token", content_type = "text/html", body = String),
        (status = 429, description = "Too many failed sign-ins or wrong tokens from this address: try again after Retry-After seconds", content_type = "text/html", body = String),
    ))]
pub async fn login(State(state): State<AppState>, source: SourceAddress, body: Bytes) -> Response {
    let mut token = None;
    let mut next = None;
    for (k, v) in form_urlencoded::parse(&body) {
        match k.as_ref() {
            "token" => token = Some(v.trim().to_string()),
            "next" => next = Some(v.into_owned()),
            _ => {}
        }
    }
    let next = safe_next(next.as_deref());
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        let form = login_form(&next, Some("No token given."));
        return (StatusCode::BAD_REQUEST, form).into_response();
    };
    if let Err(ApiError::TooManyRequests { retry_after_secs }) = state.failures.check(source.0) {
        let why =
            format!("Too many wrong tokens from this address: try again in {retry_after_secs} s.");
        let retry = [(header::RETRY_AFTER, retry_after_secs.to_string())];
        return (
            StatusCode::TOO_MANY_REQUESTS,
            retry,
            login_form(&next, Some(&why)),
        )
            .into_response();
    }
    // Only what a cookie value may hold (RFC 6265 cookie-octet): no `;`, `,`, spaces or
    // control characters that would end the value and add attributes of the sender's.
    if !token.bytes().all(is_cookie_octet) {
        state.failures.record_failure(source.0);
        let form = login_form(&next, Some("That is not a token this server issues."));
        return (StatusCode::BAD_REQUEST, form).into_response();
    }
    match state.service.authenticate(&token).await {
        Ok(Some(caller)) if caller.trial_scope.is_none() => {
            let secure = if state.https() { "; Secure" } else { "" };
            let cookie =
                format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}");
            with_cookie(Redirect::to(&next).into_response(), &cookie)
        }
        Ok(Some(_)) => {
            let why = "A trial's token may only report to its trial: it cannot sign in.";
            (StatusCode::FORBIDDEN, login_form(&next, Some(why))).into_response()
        }
        Ok(None) => {
            state.failures.record_failure(source.0);
            let why = "Unknown or expired token.";
            (StatusCode::UNAUTHORIZED, login_form(&next, Some(why))).into_response()
        }
        Err(e) => crate::api::error::ApiError::from(e).into_response(),
    }
}

/// Forget the token: the cookie is cleared and the browser goes to the login form.
#[utoipa::path(post, path = "/logout", tag = "dashboard",
    responses(
        (status = 303, description = "Signed out: the cookie is cleared, on to the login form"),
        (status = 403, description = "Posted from another site", content_type = "text/html", body = String),
    ))]
pub async fn logout(State(state): State<AppState>) -> Response {
    // Refused from another site by the guard (`api/guard.rs`).
    let secure = if state.https() { "; Secure" } else { "" };
    let cookie = format!("{TOKEN_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}");
    with_cookie(Redirect::to("/login").into_response(), &cookie)
}

fn with_cookie(mut response: Response, cookie: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

/// RFC 6265 `cookie-octet`: visible ASCII but `"`, `,`, `;` and `\`.
fn is_cookie_octet(b: u8) -> bool {
    b.is_ascii_graphic() && !matches!(b, b'"' | b',' | b';' | b'\\')
}

/// Only paths of this server: a login link must not send people to another site. Browsers
/// drop tabs and line breaks inside URLs and read `\` as `/`, so `/\t/evil.example` and
/// `/\evil.example` are other sites: only visible ASCII without `\` is taken, and only if a
/// URL parser, resolving it against this server, stays here.
fn safe_next(next: Option<&str>) -> String {
    let Some(next) = next else {
        return "/".into();
    };
    let plain = next.starts_with('/')
        && !next.starts_with("//")
        && next.bytes().all(|b| b.is_ascii_graphic() && b != b'\\');
    let here = url::Url::parse("http://augur.invalid/")
        .and_then(|base| base.join(next))
        .is_ok_and(|u| u.host_str() == Some("augur.invalid") && u.port().is_none());
    if plain && here {
        next.into()
    } else {
        "/".into()
    }
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn asset(body: &'static str, content_type: &'static str, immutable: bool) -> Response {
    let cache = if immutable {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, cache),
        ],
        body,
    )
        .into_response()
}

/// One of the dashboard's JavaScript modules (`main.js` is the entry point the pages load).
#[utoipa::path(get, path = "/dashboard/js/{module}", tag = "dashboard",
    params(("module" = String, Path, description = "module file name, e.g. `main.js`")),
    responses(
        (status = 200, description = "A JavaScript module", content_type = "text/javascript", body = String),
        (status = 404, description = "No module of that name", body = crate::api::error::ErrorBody),
    ))]
pub async fn js_module(Path(module): Path<String>) -> Result<Response, ApiError> {
    let (_, source) = MODULES
        .iter()
        .find(|(name, _)| *name == module)
        .ok_or_else(|| ApiError::NotFound("no such dashboard module".into()))?;
    Ok(asset(source, "text/javascript; charset=utf-8", false))
}

/// The dashboard's style sheet.
#[utoipa::path(get, path = "/dashboard/style.css", tag = "dashboard",
    responses((status = 200, description = "CSS", content_type = "text/css", body = String)))]
pub async fn style_css() -> Response {
    asset(STYLE_CSS, "text/css; charset=utf-8", false)
}

/// plotly.js, as shipped by the `plotly` crate.
#[utoipa::path(get, path = "/dashboard/plotly.min.js", tag = "dashboard",
    responses((status = 200, description = "JavaScript", content_type = "text/javascript", body = String)))]
pub async fn plotly_js() -> Response {
    asset(PLOTLY_JS.as_str(), "text/javascript; charset=utf-8", true)
}

/// A vendored library's file (`assets/vendor/`): xterm.js, its fit addon and its style sheet.
/// Pages ask for it with `?v=` the server's version, so it may be kept for good.
#[utoipa::path(get, path = "/dashboard/vendor/{file}", tag = "dashboard",
    params(("file" = String, Path, description = "file name, e.g. `xterm.js`")),
    responses(
        (status = 200, description = "JavaScript or CSS", content_type = "text/javascript", body = String),
        (status = 404, description = "No file of that name", body = crate::api::error::ErrorBody),
    ))]
pub async fn vendor_file(Path(file): Path<String>) -> Result<Response, ApiError> {
    let (_, body, content_type) = VENDOR
        .iter()
        .find(|(name, _, _)| *name == file)
        .ok_or_else(|| ApiError::NotFound("no such dashboard file".into()))?;
    Ok(asset(body, content_type, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plotly_is_cut_whole_out_of_the_crates_script_tags() {
        let js = PLOTLY_JS.as_str();
        assert!(
            js.trim_start().starts_with("/**\n* plotly.js v"),
            "{}",
            &js[..80]
        );
        assert!(js.len() > 1_000_000, "{}", js.len());
        // plotly.min.js alone is 4.65 MB; MathJax would add 2 MB more.
        assert!(js.len() < 4_800_000, "MathJax came along: {}", js.len());
        assert!(!js.trim_end().ends_with("</script>"));
    }

    #[test]
    fn the_served_modules_are_the_files_of_assets_js_and_import_only_each_other() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/dashboard/assets/js");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .expect("assets/js")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        on_disk.sort();
        let mut served: Vec<String> = MODULES.iter().map(|(name, _)| name.to_string()).collect();
        served.sort();
        assert_eq!(served, on_disk);
        // Imports name served modules, relative to the importer's URL.
        for (name, source) in MODULES {
            for import in source.split("from './").skip(1) {
                let target = import.split('\'').next().unwrap_or_default();
                assert!(
                    MODULES.iter().any(|(served, _)| *served == target),
                    "{name} imports {target}, which is not served"
                );
            }
        }
    }

    #[test]
    fn login_redirects_only_to_local_paths() {
        assert_eq!(safe_next(Some("/studies/3")), "/studies/3");
        assert_eq!(safe_next(Some("//evil.example")), "/");
        assert_eq!(safe_next(Some("https://evil.example")), "/");
        assert_eq!(safe_next(None), "/");
        for foreign in [
            "/\t/evil.example",
            "/\\evil.example",
            "/\n/x",
            "/ /x",
            "/\u{85}/x",
        ] {
            assert_eq!(safe_next(Some(foreign)), "/", "{foreign:?}");
        }
        assert_eq!(
            safe_next(Some("/compare?studies=1,2")),
            "/compare?studies=1,2"
        );
    }
}
