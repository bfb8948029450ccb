//! §2.3 `GET /api/v2/organizations/{organization}`.

use crate::api::{ApiError, Reply};
use crate::state::{State, User};

/// An unknown organization gets coderd's generic not-found 404, one JSON object (coderd
/// `httpmw/organizationparam.go` since PR #13629; the older doubled body is a fault).
pub fn get(state: &State, caller: &User, ident: &str) -> Result<Reply, ApiError> {
    state
        .organization_for(caller, ident)
        .map(|org| Reply::json(200, org))
}
