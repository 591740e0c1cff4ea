//! How the HTTP service says no: a status code and a one-line body `STATUS: message`
//! (docs/http.md, "Status codes"). Client errors (errnos) map to the status an HTTP tool
//! expects, so `curl -f` and browsers behave as they do against any web server.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use shoal_client::Errno;

/// A refused or failed request.
#[derive(Debug)]
pub(crate) struct HttpError {
    pub status: StatusCode,
    pub msg: String,
}

impl HttpError {
    pub fn new(status: StatusCode, msg: impl Into<String>) -> HttpError {
        HttpError { status, msg: msg.into() }
    }

    pub fn bad_request(msg: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::BAD_REQUEST, msg)
    }

    /// 401: the request proved no identity that may do this. The `WWW-Authenticate`
    /// challenge tells the caller a bearer token is what is wanted.
    pub fn unauthorized(msg: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::UNAUTHORIZED, msg)
    }
}

/// The status of a failed file system call. EACCES/EPERM are 403: the identity was known
/// (a token's, or the configured anonymous one) and POSIX permissions refused it; the
/// "no token for a write" case is answered 401 before any call is made.
pub(crate) fn status_of(errno: Errno) -> StatusCode {
    match errno {
        Errno::ENOENT => StatusCode::NOT_FOUND,
        Errno::EACCES | Errno::EPERM | Errno::EROFS => StatusCode::FORBIDDEN,
        Errno::EEXIST | Errno::ENOTEMPTY | Errno::EISDIR | Errno::ENOTDIR | Errno::EBUSY => StatusCode::CONFLICT,
        Errno::ENOSPC => StatusCode::INSUFFICIENT_STORAGE,
        Errno::EFBIG => StatusCode::PAYLOAD_TOO_LARGE,
        Errno::ETIMEDOUT => StatusCode::GATEWAY_TIMEOUT,
        Errno::EINVAL | Errno::ENAMETOOLONG | Errno::ELOOP => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<shoal_client::Error> for HttpError {
    fn from(e: shoal_client::Error) -> HttpError {
        HttpError::new(status_of(e.errno), e.to_string())
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        // One line whatever the message held, so scripts can print it as it comes.
        let body = format!("{}: {}\n", self.status, self.msg.replace(['\r', '\n'], " "));
        let mut r = (self.status, body).into_response();
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        if self.status == StatusCode::UNAUTHORIZED {
            h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"shoal\""));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_map_to_the_statuses_http_tools_expect() {
        assert_eq!(status_of(Errno::ENOENT), StatusCode::NOT_FOUND);
        assert_eq!(status_of(Errno::EACCES), StatusCode::FORBIDDEN);
        assert_eq!(status_of(Errno::ENOTEMPTY), StatusCode::CONFLICT);
        assert_eq!(status_of(Errno::ENOSPC), StatusCode::INSUFFICIENT_STORAGE);
        assert_eq!(status_of(Errno::ETIMEDOUT), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(status_of(Errno::EINVAL), StatusCode::BAD_REQUEST);
        assert_eq!(status_of(Errno::EIO), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
