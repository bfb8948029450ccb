//! Why a reconcile failed, by the stage of the pass that failed. Gates and the pure stages do not
//! fail: a gate that does not pass blocks the pass, which is no error (R-PRE-5).
use kube::runtime::finalizer;

use crate::coderd::CoderdError;
use crate::fence::FenceError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the CR or an object it names.
    #[error("reading the provisioner's objects failed: {0}")]
    Dereference(#[source] kube::Error),
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The API server refused a child object (the reason is also in the status).
    #[error("applying a child object failed: {0}")]
    Apply(#[source] kube::Error),
    /// A write refused because the object changed since the pass read it, or was created since
    /// the pass found it absent (409 Conflict or AlreadyExists): another writer, or a new leader,
    /// wrote first. The pass ends without further writes and starts again from
    /// fresh reads (R-HA-2).
    #[error("a write rested on a stale read and was refused: {0}")]
    Stale(#[source] kube::Error),
    /// Stopped before a write to Kubernetes (a child object, the finalizer) by the leadership
    /// fence: a deposed leader writes nothing (R-HA-2).
    #[error("stopped before writing to Kubernetes: {0}")]
    Fenced(#[source] FenceError),
    #[error(transparent)]
    Status(#[from] StatusError),
    #[error(transparent)]
    Cleanup(#[from] CleanupError),
    #[error(transparent)]
    Finalizer(#[from] Box<finalizer::Error<Error>>),
}

/// The key stage: coderd's key calls and the key Secret.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("provisioner key step failed: {0}")]
    Coderd(#[from] CoderdError),
    #[error("writing the provisioner key Secret failed: {0}")]
    SecretWrite(#[source] kube::Error),
    #[error("stopped before changing a provisioner key: {0}")]
    Fenced(#[from] FenceError),
}

/// The status write: at the end of the pass, and early to record a new key (R-KEY-7).
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("writing the status failed: {0}")]
    Write(#[from] kube::Error),
    /// Every status write is fenced: a deposed leader writes none, failure statuses included.
    #[error("stopped before writing the status: {0}")]
    Fenced(#[from] FenceError),
}

/// Why the clean-up could not delete the recorded key. The message goes into a Warning Event and
/// carries no secret.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("reading CoderControlPlane {name:?} failed: {source}")]
    ControlPlaneUnreadable {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("CoderControlPlane {name:?} no longer exists")]
    ControlPlaneGone { name: String },
    #[error("reading the operator token Secret failed: {0}")]
    TokenSecretUnreadable(#[source] kube::Error),
    /// Operator access is not usable: the message of the gate that blocked.
    #[error("{0}")]
    NoAccess(String),
    #[error(transparent)]
    Coderd(#[from] CoderdError),
    #[error("stopped before deleting the provisioner key: {0}")]
    Fenced(#[from] FenceError),
}

impl Error {
    /// The `stage` label of the reconcile error metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Dereference(_) => "dereference",
            Self::Key(_) => "keys",
            Self::Apply(_) | Self::Stale(_) | Self::Fenced(_) => "apply",
            Self::Status(_) => "status",
            Self::Cleanup(_) => "cleanup",
            Self::Finalizer(error) => match error.as_ref() {
                finalizer::Error::ApplyFailed(inner) | finalizer::Error::CleanupFailed(inner) => {
                    inner.metric_label()
                }
                _ => "finalizer",
            },
        }
    }

    /// A write the API server refused as stale: `Stale` for an object this pass read at a
    /// version that changed since (or found absent, and someone created meanwhile).
    pub fn refused_as_stale(error: kube::Error) -> Result<Self, kube::Error> {
        match &error {
            kube::Error::Api(response) if response.code == 409 => Ok(Self::Stale(error)),
            _ => Err(error),
        }
    }

    /// A pass stopped by the leadership fence: it writes nothing more, not even its status,
    /// which is the new leader's to write.
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            Self::Key(KeyError::Fenced(_) | KeyError::Coderd(CoderdError::Fenced { .. }))
                | Self::Status(StatusError::Fenced(_))
                | Self::Fenced(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn fenced() -> FenceError {
        FenceError::TermEnded
    }

    #[rstest]
    #[case::key(Error::Key(KeyError::Coderd(CoderdError::Timeout)), "keys")]
    #[case::status(Error::Status(StatusError::Fenced(fenced())), "status")]
    #[case::cleanup(Error::Cleanup(CleanupError::NoAccess("no token".into())), "cleanup")]
    #[case::inside_the_finalizer(
        Error::Finalizer(Box::new(finalizer::Error::ApplyFailed(Error::Key(
            KeyError::Fenced(fenced())
        )))),
        "keys"
    )]
    #[case::the_finalizer_itself(
        Error::Finalizer(Box::new(finalizer::Error::UnnamedObject)),
        "finalizer"
    )]
    fn each_error_is_labelled_with_its_stage(#[case] error: Error, #[case] label: &str) {
        assert_eq!(error.metric_label(), label);
    }

    #[rstest]
    #[case::fence(Error::Key(KeyError::Fenced(fenced())), true)]
    #[case::fenced_coderd_write(Error::Key(KeyError::Coderd(CoderdError::Fenced { detail: "term over".into() })), true)]
    #[case::fenced_key_record(Error::Status(StatusError::Fenced(fenced())), true)]
    #[case::fenced_child_write(Error::Fenced(fenced()), true)]
    #[case::coderd_failure(Error::Key(KeyError::Coderd(CoderdError::Timeout)), false)]
    fn only_a_fence_stops_a_pass_silently(#[case] error: Error, #[case] fenced: bool) {
        assert_eq!(error.is_fenced(), fenced);
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("refused", "Conflict")
                .with_code(code)
                .boxed(),
        )
    }

    #[rstest]
    #[case::conflict_or_already_exists(409, true)]
    #[case::invalid(422, false)]
    #[case::forbidden(403, false)]
    fn only_a_conflict_is_a_stale_write(#[case] code: u16, #[case] stale: bool) {
        assert_eq!(
            matches!(
                Error::refused_as_stale(api_error(code)),
                Ok(Error::Stale(_))
            ),
            stale
        );
    }
}
