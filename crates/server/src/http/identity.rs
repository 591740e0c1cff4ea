//! Who an HTTP request acts as (docs/http.md, "Identity"): the identity of a bearer token
//! (`Authorization: Bearer shoal1.…`, made by `shoal token`), else the anonymous identity
//! of the map's `[http]` table, which may only read — or nothing, under
//! `anonymous = "none"`. The gateway then acts as that identity through
//! `Client::with_cred`, so POSIX permissions decide as for any other client.

use super::errors::HttpError;
use super::Gateway;
use axum::http::{header, HeaderMap};
use shoal_auth::http_token;
use shoal_placement::map::AnonymousAccess;
use shoal_proto::msg::Cred;

/// The identity the request with `headers` proved; `write` for requests that change the
/// file system, which only token holders may make.
pub(crate) fn who(gw: &Gateway, headers: &HeaderMap, write: bool) -> Result<Cred, HttpError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        if write {
            return Err(HttpError::unauthorized(
                "writes need a token: Authorization: Bearer TOKEN (see `shoal token`)",
            ));
        }
        return match gw.settings.anonymous {
            AnonymousAccess::Read => {
                Ok(Cred { uid: gw.settings.anonymous_uid, gid: gw.settings.anonymous_gid, groups: Vec::new() })
            }
            AnonymousAccess::None => Err(HttpError::unauthorized(
                "this cluster serves no anonymous requests: Authorization: Bearer TOKEN (see `shoal token`)",
            )),
        };
    };
    let text = value.to_str().map_err(|_| HttpError::unauthorized("Authorization header is not ASCII"))?;
    let token = match text.split_once(' ') {
        Some((scheme, t)) if scheme.eq_ignore_ascii_case("bearer") => t.trim(),
        _ => return Err(HttpError::unauthorized("Authorization must be `Bearer TOKEN`")),
    };
    // Under auth = "none" the servers hold no keys and the token's identity is taken as
    // stated, as the binary protocol takes a client's in that mode.
    let ring = gw.st.key_ring().map(|r| r.host_ring());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let c = http_token::parse(token, ring.as_ref(), now).map_err(|e| HttpError::unauthorized(e.to_string()))?;
    Ok(Cred { uid: c.uid, gid: c.gid, groups: c.groups })
}
