//! Helpers shared by the integration tests: an HTTP client (with the ring provider installed, see
//! crates-verified gotcha 4) and a small "send and capture the whole answer" function.
#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use fake_coderd::FakeCoderd;
use serde_json::Value;

pub const JSON: &str = "application/json; charset=utf-8";

/// Installs the ring provider (once per process) and builds a client.
pub fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        // A connection kept from before the listener was closed and reopened would fail the
        // next request on it: each request opens its own, as a client after an outage does.
        .pool_max_idle_per_host(0)
        .build()
        .expect("reqwest client builds")
}

#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    pub fn content_type(&self) -> Option<&str> {
        self.header("content-type")
    }

    /// The body as one JSON document; also asserts the §1.1 content type that every JSON answer
    /// must carry, and the trailing newline of Go's `json.Encoder`.
    pub fn json(&self) -> Value {
        let mut values = self.json_values();
        assert_eq!(values.len(), 1, "one JSON value expected: {}", self.text);
        values.remove(0)
    }

    /// Every JSON value of the body, in order (coderd writes two for an unknown organization).
    pub fn json_values(&self) -> Vec<Value> {
        assert_eq!(
            self.content_type(),
            Some(JSON),
            "JSON answer {} without JSON content type: {}",
            self.status,
            self.text
        );
        assert!(
            self.text.ends_with('\n'),
            "json.Encoder ends every value with a newline: {:?}",
            self.text
        );
        serde_json::Deserializer::from_str(&self.text)
            .into_iter::<Value>()
            .collect::<Result<Vec<Value>, _>>()
            .unwrap_or_else(|error| panic!("not JSON ({error}): {}", self.text))
    }
}

pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: Vec<(&'a str, String)>,
    pub body: Option<String>,
}

impl<'a> Request<'a> {
    pub fn new(method: &'a str, path: &'a str) -> Self {
        Self {
            method,
            path,
            headers: Vec::new(),
            body: None,
        }
    }

    pub fn token(self, token: &str) -> Self {
        self.header("Coder-Session-Token", token)
    }

    pub fn header(mut self, name: &'a str, value: &str) -> Self {
        self.headers.push((name, value.to_string()));
        self
    }

    pub fn body(mut self, body: &str) -> Self {
        self.body = Some(body.to_string());
        self.header("Content-Type", "application/json")
    }

    pub async fn send(self, http: &reqwest::Client, base_url: &str) -> Answer {
        let method = reqwest::Method::from_bytes(self.method.as_bytes()).expect("valid method");
        let mut request = http.request(method, format!("{base_url}{}", self.path));
        for (name, value) in &self.headers {
            request = request.header(*name, value);
        }
        if let Some(body) = self.body {
            request = request.body(body);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|error| panic!("{} {}: {error}", self.method, self.path));
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.expect("body readable");
        Answer {
            status,
            headers,
            text,
        }
    }
}

/// A fake plus a client, the usual starting point.
pub struct Env {
    pub fake: FakeCoderd,
    pub http: reqwest::Client,
}

impl Env {
    pub async fn start() -> Env {
        Env {
            fake: FakeCoderd::start().await.expect("fake starts"),
            http: http(),
        }
    }

    pub async fn send(&self, request: Request<'_>) -> Answer {
        request.send(&self.http, &self.fake.url()).await
    }

    /// A request authenticated as the owner operator.
    pub async fn as_operator(&self, request: Request<'_>) -> Answer {
        self.send(request.token(&self.fake.operator_token())).await
    }

    pub async fn create_key(&self, org: &str, name: &str) -> Answer {
        let path = format!("/api/v2/organizations/{org}/provisionerkeys");
        let body = serde_json::json!({ "name": name, "tags": null }).to_string();
        self.as_operator(Request::new("POST", &path).body(&body))
            .await
    }
}

/// Sorted top-level field names of a JSON object.
pub fn field_names(value: &Value) -> Vec<String> {
    let mut names: Vec<String> = value
        .as_object()
        .expect("a JSON object")
        .keys()
        .cloned()
        .collect();
    names.sort();
    names
}
