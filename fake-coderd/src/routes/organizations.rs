//! §2.3 `GET /api/v2/organizations/{organization}`.

use crate::api::{ApiError, Reply};
use crate::state::{State, User};

/// An unknown organization gets coderd's doubled 404 body: the generic not-found object, then
/// `{"message":"Organization \"x\" not found.","detail":…}` (coderd `httpmw/organizationparam.go`).
pub fn get(state: &State, caller: &User, ident: &str) -> Result<Reply, ApiError> {
    state
        .organization_for(caller, ident)
        .map(|org| Reply::json(200, org))
}
