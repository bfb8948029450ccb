//! §2.2 `GET /api/v2/users/{user}` (`me`, or a username or id).

use crate::api::{ApiError, Reply};
use crate::state::{State, User};

pub fn get(state: &State, caller: &User, ident: &str) -> Result<Reply, ApiError> {
    let user = if ident == "me" {
        caller
    } else {
        // Only owners may look at other users; others get the not-found answer (§1.5).
        state
            .user_by_name_or_id(ident)
            .filter(|user| caller.is_owner() || user.id == caller.id)
            .ok_or_else(ApiError::resource_not_found)?
    };
    Ok(Reply::json(200, state.user_view(user)))
}
