//! §2.3 `GET /api/v2/organizations/{organization}`.

use crate::api::{ApiError, Reply};
use crate::state::{State, User};

/// Only the first JSON object of coderd's doubled 404 body is sent (§2.3 "Fake: emit only the first object").
pub fn get(state: &State, caller: &User, ident: &str) -> Result<Reply, ApiError> {
    state
        .organization_for(caller, ident)
        .map(|org| Reply::json(200, org))
}
