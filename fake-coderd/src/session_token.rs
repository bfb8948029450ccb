//! coderd's session token shape, `<10>-<22>` (coderd-api.md §1.4).

pub(crate) const TOKEN_ID_LENGTH: usize = 10;
pub(crate) const TOKEN_SECRET_LENGTH: usize = 22;

/// Why a session token is not `<10>-<22>` shaped, in coderd's words (§1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenFormatError {
    #[error("incorrect amount of API key parts, expected 2 got {0}")]
    PartCount(usize),
    #[error("invalid API key ID length, expected {TOKEN_ID_LENGTH} got {0}")]
    IdLength(usize),
    #[error("invalid API key secret length, expected {TOKEN_SECRET_LENGTH} got {0}")]
    SecretLength(usize),
}

/// Splits a session token as coderd does (§1.4).
pub fn split_session_token(token: &str) -> Result<(&str, &str), TokenFormatError> {
    let parts: Vec<&str> = token.split('-').collect();
    let [id, secret] = parts.as_slice() else {
        return Err(TokenFormatError::PartCount(parts.len()));
    };
    if id.len() != TOKEN_ID_LENGTH {
        return Err(TokenFormatError::IdLength(id.len()));
    }
    if secret.len() != TOKEN_SECRET_LENGTH {
        return Err(TokenFormatError::SecretLength(secret.len()));
    }
    Ok((id, secret))
}
