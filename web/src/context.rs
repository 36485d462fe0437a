//! [`Ctx`]: what every page needs from its request — the prefix the router is nested
//! at, the CSRF token, a nonce for the page's script — and the response headers every
//! page carries.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{FromRequestParts, NestedPath};
use axum::http::StatusCode;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use maud::Markup;

use crate::Dashboard;
use crate::error::Error;
use crate::format;
use crate::layout;

/// The name of the cookie that holds the CSRF token.
pub(crate) const CSRF_COOKIE: &str = "task_dedup_csrf";

/// Random bytes in a CSRF token (hex in the cookie and the forms).
const TOKEN_BYTES: usize = 32;

/// The request's view of the dashboard.
pub(crate) struct Ctx {
    /// The configuration.
    pub app: Arc<Dashboard>,
    /// The prefix the router is nested at (`/admin`), or empty at the root.
    pub base: String,
    /// The CSRF token the forms carry: the cookie's, or a fresh one the response sets.
    pub csrf: String,
    /// The token as the request's cookie had it, if it had a well-formed one.
    pub cookie_token: Option<String>,
    /// A nonce for the page's inline script (the Content-Security-Policy allows it).
    pub nonce: String,
    /// The request's headers (the CSRF check reads fetch metadata and `Origin`).
    pub headers: HeaderMap,
    /// The host the request was sent to: its `Host` header, or the URI's authority
    /// (HTTP/2 sends `:authority` instead of `Host`).
    pub host: Option<String>,
}

impl FromRequestParts<Arc<Dashboard>> for Ctx {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &Arc<Dashboard>,
    ) -> Result<Ctx, Infallible> {
        let base = parts
            .extensions
            .get::<NestedPath>()
            .map(|nested| nested.as_str().trim_end_matches('/').to_owned())
            .unwrap_or_default();
        let cookie_token = cookie(&parts.headers, CSRF_COOKIE).filter(|t| well_formed(t));
        Ok(Ctx {
            app: Arc::clone(app),
            base,
            csrf: cookie_token.clone().unwrap_or_else(fresh_token),
            cookie_token,
            nonce: hex(&rand::random::<[u8; 16]>()),
            host: parts
                .headers
                .get(header::HOST)
                .and_then(|host| host.to_str().ok())
                .map(str::to_owned)
                .or_else(|| parts.uri.authority().map(|a| a.as_str().to_owned())),
            headers: parts.headers.clone(),
        })
    }
}

impl Ctx {
    /// The overview's URL: the prefix itself (axum routes `/admin`, not `/admin/`, to a
    /// router nested at `/admin`).
    pub fn home(&self) -> String {
        if self.base.is_empty() {
            "/".to_owned()
        } else {
            self.base.clone()
        }
    }

    /// The URL of `path` (starting with `/`) in the dashboard.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The list of tasks, with `query` (pairs with empty values left out).
    pub fn tasks_url(&self, query: &[(&str, &str)]) -> String {
        let query = format::query(query);
        if query.is_empty() {
            self.url("/tasks")
        } else {
            format!("{}?{query}", self.url("/tasks"))
        }
    }

    /// The page of task `id`.
    pub fn task_url(&self, id: impl std::fmt::Display) -> String {
        format!("{}/tasks/{id}", self.base)
    }

    /// An HTML page with the headers every page carries: no caching, a strict
    /// Content-Security-Policy, the CSRF cookie when the request had none.
    pub fn html(&self, status: StatusCode, page: Markup) -> Response {
        let mut response = (status, page.into_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        );
        let policy = format!(
            "default-src 'none'; style-src 'self'; img-src 'self'; script-src 'nonce-{}'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            self.nonce
        );
        if let Ok(policy) = HeaderValue::from_str(&policy) {
            headers.insert(header::CONTENT_SECURITY_POLICY, policy);
        }
        if self.cookie_token.is_none() {
            let path = if self.base.is_empty() {
                "/"
            } else {
                &self.base
            };
            let cookie = format!(
                "{CSRF_COOKIE}={}; Path={path}; HttpOnly; SameSite=Strict",
                self.csrf
            );
            // The prefix comes from the route table: printable ASCII, but keep a
            // header that would not parse out rather than fail the page.
            if let Ok(cookie) = HeaderValue::from_str(&cookie) {
                headers.append(header::SET_COOKIE, cookie);
            }
        }
        response
    }

    /// The page for `error`, with its status.
    pub fn error(&self, error: Error) -> Response {
        if let Error::Database(err) = &error {
            tracing::error!(error = %err, "task-dedup-web: a database call failed");
        }
        self.html(error.status(), layout::error_page(self, &error))
    }

    /// A page, or the page of its error.
    pub fn respond(&self, page: Result<Response, Error>) -> Response {
        page.unwrap_or_else(|error| self.error(error))
    }

    /// `303 See Other` to `location` (an action's outcome: reloading the page it leads
    /// to does not repeat the action).
    pub fn see_other(&self, location: &str) -> Response {
        match HeaderValue::from_str(location) {
            Ok(location) => (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response(),
            Err(_) => self.error(Error::BadRequest("unusable redirect".to_owned())),
        }
    }
}

/// Every path under the prefix that the routes do not know: 404.
pub(crate) async fn not_found(ctx: Ctx) -> Response {
    ctx.error(Error::NoSuchPage)
}

/// A known path with another method (`GET` of an action): 405.
pub(crate) async fn method_not_allowed(ctx: Ctx) -> Response {
    ctx.error(Error::MethodNotAllowed)
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim().to_owned())
}

/// A new CSRF token.
fn fresh_token() -> String {
    hex(&rand::random::<[u8; TOKEN_BYTES]>())
}

/// Whether `token` looks like one of ours (anything else is treated as no cookie).
fn well_formed(token: &str) -> bool {
    token.len() == TOKEN_BYTES * 2 && token.bytes().all(|b| b.is_ascii_hexdigit())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Ctx {
    /// Whether an action may run: the dashboard is not read-only, the request comes from
    /// the dashboard's own origin, and `form_token` is the cookie's token.
    pub fn allow_action(&self, form_token: Option<&str>) -> Result<(), Error> {
        if self.app.read_only {
            return Err(Error::ReadOnly);
        }
        let header = |name| self.headers.get(name).and_then(|v| v.to_str().ok());
        match header("sec-fetch-site") {
            Some("same-origin" | "none") => {}
            Some(_) => return Err(Error::Csrf("the request came from another site")),
            None => {
                if let Some(origin) = header("origin")
                    && !same_origin(origin, self.host.as_deref())
                {
                    return Err(Error::Csrf("the request came from another origin"));
                }
            }
        }
        match (&self.cookie_token, form_token) {
            (Some(cookie), Some(field))
                if constant_time_eq(cookie.as_bytes(), field.as_bytes()) =>
            {
                Ok(())
            }
            (None, _) => Err(Error::Csrf(
                "the CSRF cookie is missing (reload the page and try again)",
            )),
            _ => Err(Error::Csrf("the form's CSRF token is missing or wrong")),
        }
    }
}

/// Whether `origin` (`scheme://host[:port]`) names `host` (the `Host` header).
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else { return false };
    origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .is_some_and(|authority| authority.eq_ignore_ascii_case(host))
}

/// Compares without stopping at the first difference (the token is a secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_and_origins_are_read_strictly() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; task_dedup_csrf=abc ; b=2"),
        );
        assert_eq!(cookie(&headers, CSRF_COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&headers, "c"), None);
        assert!(well_formed(&fresh_token()));
        assert!(!well_formed("abc"));
        assert!(same_origin("http://127.0.0.1:3000", Some("127.0.0.1:3000")));
        assert!(!same_origin("http://evil.example", Some("127.0.0.1:3000")));
        assert!(!same_origin("null", Some("127.0.0.1:3000")));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
