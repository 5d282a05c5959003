//! The web console on the HTTP status listener: `/` (the page), its script
//! and style, and `/api/console` (the JSON it polls every 2 s).
//!
//! ```text
//! browser ── GET / ─────────────▶ index.html ─▶ console.js, console.css (all in the binary)
//!         ── GET /api/console ──▶ {controller: view | null, directory: view | null}
//!                                   controller: stele_controller::console::view (pure)
//!                                   directory:  stele_directory::console::view (pure)
//! ```
//!
//! The assets are compiled in (`include_str!`): nothing is fetched at run
//! time, from anywhere else, and the page's Content-Security-Policy allows
//! only this origin. The console is read-only: it has no route that
//! changes anything (docs/SECURITY.md). A process without a controller or
//! a directory serves the page with nothing to show but that.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

const INDEX_HTML: &str = include_str!("console/index.html");
const CONSOLE_JS: &str = include_str!("console/console.js");
const CONSOLE_CSS: &str = include_str!("console/console.css");

/// Only this origin, nothing inline: the page loads its script and style
/// from the binary and fetches only `/api/console`.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// What this process can show: its controller and its directory member.
#[derive(Default)]
struct Sources {
    controller: OnceLock<Arc<stele_controller::Controller>>,
    directory: OnceLock<Arc<stele_directory::Directory>>,
}

fn sources() -> &'static Sources {
    static SOURCES: OnceLock<Sources> = OnceLock::new();
    SOURCES.get_or_init(Sources::default)
}

/// Shows `c`'s cell from now on (the controller role, once per process).
pub fn show_controller(c: Arc<stele_controller::Controller>) {
    let _ = sources().controller.set(c);
}

/// Shows `d`'s namespaces by cell from now on (the directory role).
pub fn show_directory(d: Arc<stele_directory::Directory>) {
    let _ = sources().directory.set(d);
}

/// The JSON the page draws: each view this process has, `null` for the
/// others.
fn api_json() -> serde_json::Value {
    let s = sources();
    let controller = s
        .controller
        .get()
        .map(|c| stele_controller::console::current(c, Instant::now()));
    let directory = s.directory.get().map(|d| {
        stele_directory::console::view(&d.quorum.state(), d.opts.id, d.quorum.is_leader())
    });
    serde_json::json!({
        "version": stele_proto::formats::binary_version(),
        "controller": controller,
        "directory": directory,
    })
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// The console's routes, to merge into the HTTP status listener's router.
pub fn router() -> axum::Router {
    axum::Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", CONSOLE_JS) }),
        )
        .route(
            "/console.css",
            get(|| async { asset("text/css; charset=utf-8", CONSOLE_CSS) }),
        )
        .route(
            "/api/console",
            get(|| async {
                // The views lock the health view and clone state: brief, but
                // not for the async runtime's threads to wait on.
                let body = tokio::task::spawn_blocking(api_json)
                    .await
                    .unwrap_or_else(|_| serde_json::json!({"error": "view failed"}));
                (
                    [
                        (header::CONTENT_TYPE, "application/json"),
                        (header::CACHE_CONTROL, "no-store"),
                        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                    ],
                    body.to_string(),
                )
            }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_assets_fetch_nothing_from_elsewhere() {
        for (name, text) in [
            ("index.html", INDEX_HTML),
            ("console.js", CONSOLE_JS),
            ("console.css", CONSOLE_CSS),
        ] {
            for bad in [
                "http://",
                "https://",
                "//cdn",
                "@import",
                "innerHTML",
                "eval(",
            ] {
                assert!(!text.contains(bad), "{name} contains {bad:?}");
            }
        }
        assert!(INDEX_HTML.contains("src=\"/console.js\""));
        assert!(INDEX_HTML.contains("href=\"/console.css\""));
        assert!(CONSOLE_JS.contains("/api/console"));
    }

    #[test]
    fn a_process_without_a_view_says_so() {
        let v = api_json();
        assert!(v["controller"].is_null() && v["directory"].is_null());
    }
}
