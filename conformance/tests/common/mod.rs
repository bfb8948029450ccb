//! Helpers shared by the integration tests that run on a local control plane.
use std::fmt::Debug;

use conformance::wait::{self, TimeoutProfile, Timeouts};

/// Polls `probe` (local-tier deadline and interval) until it yields `expected`; on timeout the
/// error names the last value seen.
pub async fn eventually_equals<T, F, Fut>(
    what: &str,
    expected: T,
    mut probe: F,
) -> anyhow::Result<()>
where
    T: PartialEq + Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let timeouts = Timeouts::for_profile(TimeoutProfile::Local);
    let expected = &expected;
    wait::eventually(what, &timeouts, move || {
        let seen = probe();
        async move {
            let seen = seen.await?;
            Ok(if seen == *expected {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            })
        }
    })
    .await
}
