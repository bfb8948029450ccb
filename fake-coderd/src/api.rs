//! Wire shapes shared by every coderd route: the `codersdk.Response` error body (coderd-api.md §1.3),
//! the canned error answers of §1.4/§1.5, and `Reply`, the route-independent answer a handler produces.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use wiremock::ResponseTemplate;

/// `Content-Type` of every JSON answer (coderd-api.md §1.1).
pub const JSON_CONTENT_TYPE: &str = "application/json; charset=utf-8";
/// `Content-Type` of the one plain-text answer, the 428 of §1.7.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

pub const SIGNED_OUT_MESSAGE: &str =
    "You are signed out or your session has expired. Please sign in again to continue.";
pub const RESOURCE_NOT_FOUND_MESSAGE: &str =
    "Resource not found or you do not have access to this resource";
pub const ROUTE_NOT_FOUND_MESSAGE: &str = "Route not found.";
pub const INTERNAL_ERROR_MESSAGE: &str = "An internal server error occurred.";
pub const FORBIDDEN_DETAIL: &str = "You don't have permission to view this content. If you believe this is a mistake, please contact your administrator or try signing in with different credentials.";
/// `detail` of the 500 a handler writes when coderd's database authorizer refuses a query:
/// `dbauthz.NotAuthorizedError` ("unauthorized: " + its cause) around `rbac.UnauthorizedError`,
/// whose text outside Go tests is `rbac: forbidden` (coderd `coderd/rbac/error.go`, commit
/// fbaaff8302859e9acff9b0ebb5afe4d8ceca52f5; `coderd/database/dbauthz/dbauthz.go`, commit
/// ccc309e8c341aef9c8e3483a4b9d8fd693f94364).
pub const AUTHORIZER_REFUSED_DETAIL: &str = "unauthorized: rbac: forbidden";
pub const FEATURE_GATE_MESSAGE: &str =
    "External Provisioner Daemons is an Enterprise feature. Contact sales!";

/// One entry of `validations` in `codersdk.Response`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Validation {
    pub field: String,
    pub detail: String,
}

/// `codersdk.Response`: `message` always present, `detail`/`validations` omitted when empty (§1.3).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ApiResponse {
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validations: Vec<Validation>,
}

/// An error answer: status plus `codersdk.Response` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub body: ApiResponse,
    /// A second `codersdk.Response` written into the same body after `body`, as coderd's
    /// organization middleware did for an unknown organization before PR #13629 (§2.3; the
    /// `legacy_organization_not_found` fault).
    pub second: Option<Box<ApiResponse>>,
}

/// Go's `%q` (`strconv.Quote`) for the strings coderd formats into messages.
pub fn go_quote(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\u{7}' => quoted.push_str("\\a"),
            '\u{8}' => quoted.push_str("\\b"),
            '\u{c}' => quoted.push_str("\\f"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            '\t' => quoted.push_str("\\t"),
            '\u{b}' => quoted.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                quoted.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => quoted.push_str(&format!("\\u{:04x}", c as u32)),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ApiResponse {
                message: message.into(),
                detail: None,
                validations: Vec::new(),
            },
            second: None,
        }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.body.detail = Some(detail.into());
        self
    }

    /// A 400 whose message is repeated as the single validation of `field` (§2.6 table).
    pub fn validation(field: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        let mut error = Self::new(400, message.clone());
        error.body.validations.push(Validation {
            field: field.to_string(),
            detail: message,
        });
        error
    }

    /// §1.4: every authentication failure shares the message, the cause is in `detail`.
    pub fn signed_out(detail: impl Into<String>) -> Self {
        Self::new(401, SIGNED_OUT_MESSAGE).with_detail(detail)
    }

    /// §1.5 generic not found (also used when the caller may not read the resource).
    pub fn resource_not_found() -> Self {
        Self::new(404, RESOURCE_NOT_FOUND_MESSAGE)
    }

    /// §2.3: an organization path value that names no organization the caller may read. Current
    /// coderd's `ExtractOrganizationParam` answers the generic not-found response alone (the second
    /// object was removed by coder/coder PR #13629, 2024-06); `arg` is kept for the legacy body.
    pub fn organization_not_found(_arg: &str) -> Self {
        Self::resource_not_found()
    }

    /// §2.3, coderd before PR #13629 (`coderd/httpmw/organizationparam.go` as stored at commit
    /// c8554470416a63dd34dfd9a035d2138665185fa9): `httpapi.ResourceNotFound(rw)` followed by a
    /// second `httpapi.Write` into the same body. Served only through the
    /// `legacy_organization_not_found` fault.
    pub fn legacy_organization_not_found(arg: &str) -> Self {
        let mut error = Self::resource_not_found();
        error.second = Some(Box::new(ApiResponse {
            message: format!("Organization {} not found.", go_quote(arg)),
            detail: Some("Provide either the organization id or name.".to_string()),
            validations: Vec::new(),
        }));
        error
    }

    /// §1.1 unknown route under /api/v2.
    pub fn route_not_found() -> Self {
        Self::new(404, ROUTE_NOT_FOUND_MESSAGE)
    }

    /// §1.5 forbidden.
    pub fn forbidden() -> Self {
        Self::new(403, "Forbidden.").with_detail(FORBIDDEN_DETAIL)
    }

    /// §1.5 enterprise feature gate for `external_provisioner_daemons`.
    pub fn feature_gate() -> Self {
        Self::new(403, FEATURE_GATE_MESSAGE)
    }

    /// The 500 coderd answers when its database authorizer refuses a write the handler does not
    /// map to another status (`httpapi.InternalServerError` with the dbauthz error as `detail`).
    pub fn authorizer_refused() -> Self {
        Self::internal(AUTHORIZER_REFUSED_DETAIL)
    }

    /// §1.5 internal error.
    pub fn internal(detail: impl Into<String>) -> Self {
        Self::new(500, INTERNAL_ERROR_MESSAGE).with_detail(detail)
    }

    /// §1.5 malformed JSON body.
    pub fn invalid_json(decoder_error: impl Into<String>) -> Self {
        Self::new(400, "Request body must be valid JSON.").with_detail(decoder_error)
    }
}

/// The body of an answer.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplyBody {
    Json(Value),
    /// Several JSON values written one after the other into one body (§2.3's legacy doubled 404).
    JsonSeq(Vec<Value>),
    Text(String),
    Empty,
}

/// A complete answer, independent of wiremock so that handlers stay pure and testable.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: ReplyBody,
    pub headers: Vec<(String, String)>,
}

impl Reply {
    pub fn json(status: u16, body: impl Serialize) -> Self {
        let body = match serde_json::to_value(body) {
            Ok(value) => ReplyBody::Json(value),
            Err(error) => return Self::from(ApiError::internal(error.to_string())),
        };
        Self {
            status,
            body,
            headers: Vec::new(),
        }
    }

    pub fn text(status: u16, text: impl Into<String>) -> Self {
        Self {
            status,
            body: ReplyBody::Text(text.into()),
            headers: Vec::new(),
        }
    }

    pub fn empty(status: u16) -> Self {
        Self {
            status,
            body: ReplyBody::Empty,
            headers: Vec::new(),
        }
    }

    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// The body's bytes and `Content-Type` (§1.1), `None` for an empty body.
    pub fn encoded_body(&self) -> Option<(Vec<u8>, &'static str)> {
        match &self.body {
            ReplyBody::Json(value) => Some((go_encode(value).into_bytes(), JSON_CONTENT_TYPE)),
            ReplyBody::JsonSeq(values) => {
                let text: String = values.iter().map(go_encode).collect();
                Some((text.into_bytes(), JSON_CONTENT_TYPE))
            }
            ReplyBody::Text(text) => Some((text.clone().into_bytes(), TEXT_CONTENT_TYPE)),
            ReplyBody::Empty => None,
        }
    }

    /// Renders the answer, always with the right `Content-Type` for its body (§1.1).
    pub fn into_template(self) -> ResponseTemplate {
        let mut template = ResponseTemplate::new(self.status);
        if let Some((bytes, content_type)) = self.encoded_body() {
            template = template.set_body_raw(bytes, content_type);
        }
        // Appended, so a repeated name (chi's one `Allow` per method) keeps every value.
        for (name, value) in self.headers {
            template = template.append_header(name.as_str(), value.as_str());
        }
        template
    }
}

/// A JSON value as Go's `json.Encoder` with `SetEscapeHTML(true)` writes it (coderd's
/// `httpapi.Write`): `<`, `>`, `&`, U+2028 and U+2029 escaped, followed by a newline.
pub fn go_encode(value: &Value) -> String {
    let mut text = String::new();
    // Outside strings JSON has none of these characters, so escaping the whole text is safe.
    for c in value.to_string().chars() {
        match c {
            '<' => text.push_str("\\u003c"),
            '>' => text.push_str("\\u003e"),
            '&' => text.push_str("\\u0026"),
            '\u{2028}' => text.push_str("\\u2028"),
            '\u{2029}' => text.push_str("\\u2029"),
            c => text.push(c),
        }
    }
    text.push('\n');
    text
}

impl From<ApiError> for Reply {
    fn from(error: ApiError) -> Self {
        match error.second {
            None => Reply::json(error.status, error.body),
            Some(second) => {
                let values = [&error.body, second.as_ref()]
                    .into_iter()
                    .map(serde_json::to_value)
                    .collect::<Result<Vec<Value>, _>>();
                match values {
                    Ok(values) => Reply {
                        status: error.status,
                        body: ReplyBody::JsonSeq(values),
                        headers: Vec::new(),
                    },
                    Err(failure) => ApiError::internal(failure.to_string()).into(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[rstest::rstest]
    #[case("x", r#""x""#)]
    #[case("a\"b\\c", r#""a\"b\\c""#)]
    #[case("tab\there\u{1}", r#""tab\there\x01""#)]
    #[case("Ünïcode", r#""Ünïcode""#)]
    fn quotes_like_go(#[case] text: &str, #[case] expected: &str) {
        assert_eq!(go_quote(text), expected);
    }

    #[test]
    fn encodes_like_go_json_encoder() {
        assert_eq!(
            go_encode(&json!({"message": "<a> & b"})),
            "{\"message\":\"\\u003ca\\u003e \\u0026 b\"}\n"
        );
    }
}
