//! The coderd listener: a wiremock `MockServer` that can be closed and reopened on the same
//! address ("coderd unreachable"), with responders over the shared world. Both the fake's Rust
//! API (`server`) and its admin API drive it.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use wiremock::{Mock, MockServer};

use crate::error::Error;
use crate::faults::FaultSpec;
use crate::world::Shared;

const REACHABILITY_DEADLINE: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_millis(20);

async fn bind_with_retry(addr: SocketAddr) -> Result<TcpListener, Error> {
    let deadline = Instant::now() + REACHABILITY_DEADLINE;
    loop {
        match TcpListener::bind(addr) {
            Ok(listener) => return Ok(listener),
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline =>
            {
                tokio::time::sleep(POLL_INTERVAL).await;
            }
            Err(source) => return Err(Error::Bind { addr, source }),
        }
    }
}

/// Waits until nothing accepts connections on `addr` any more.
async fn wait_until_closed(addr: SocketAddr) -> Result<(), Error> {
    let deadline = Instant::now() + REACHABILITY_DEADLINE;
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        if Instant::now() >= deadline {
            return Err(Error::StillAccepting {
                addr,
                waited: REACHABILITY_DEADLINE,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(())
}

/// Registers a mock from synchronous code, so that the Rust API stays synchronous. wiremock
/// registers through an async lock that only its own server thread holds, and only while it
/// matches and answers one request (our matchers and responders take nothing but the world's
/// short lock), so this waits briefly and needs no runtime.
///
/// `unconstrained`: that lock is tokio's, which answers "not now, poll again" while the calling
/// tokio task has spent its cooperative budget; a task that has, blocking here, never yields
/// to tokio to get it back, so `block_on` polled it at full speed for ever (a whole suite run
/// hung at the fake coderd's start, one core busy).
fn mount(server: &MockServer, mock: Mock) {
    futures::executor::block_on(tokio::task::unconstrained(server.register(mock)));
}

/// Stops a server: wiremock's `Drop` checks its expectations through the same lock, blocking
/// as [`mount`] does, so it runs unconstrained too (polled once, in place: the drop is
/// synchronous, and an executor here would nest in the one the drop starts).
fn stop(server: MockServer) {
    let dropped =
        futures::FutureExt::now_or_never(tokio::task::unconstrained(async move { drop(server) }));
    debug_assert!(dropped.is_some(), "a drop ends within its one poll");
}

/// The coderd listener: a wiremock `MockServer` that can be closed and reopened, always on the
/// same address, with responders over the same shared world.
pub(crate) struct CoderdListener {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// `None` while unreachable. Held while mocks are mounted, so that a fault injected during a
    /// reopen is mounted exactly once; never held across an `.await`.
    server: Mutex<Option<MockServer>>,
    /// Serialises closing and reopening.
    reachability: tokio::sync::Mutex<()>,
}

impl CoderdListener {
    pub(crate) async fn start(
        addr: SocketAddr,
        listener: TcpListener,
        shared: Arc<Shared>,
    ) -> Self {
        let coderd = CoderdListener {
            addr,
            shared,
            server: Mutex::new(None),
            reachability: tokio::sync::Mutex::new(()),
        };
        coderd.open(listener).await;
        coderd
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn server(&self) -> MutexGuard<'_, Option<MockServer>> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Serves on `listener`: the faults in force are mounted before the routes, so that no request
    /// slips past one in the moment between.
    async fn open(&self, listener: TcpListener) {
        let started = MockServer::builder()
            .listener(listener)
            .disable_request_recording()
            .start()
            .await;
        let mut server = self.server();
        let faults: Vec<Mock> = {
            let world = self.shared.lock();
            world
                .faults
                .active()
                .iter()
                .filter_map(|(id, spec)| crate::routes::fault_mock(&self.shared, *id, spec))
                .collect()
        };
        for mock in faults.into_iter().chain(crate::routes::mocks(&self.shared)) {
            mount(&started, mock);
        }
        *server = Some(started);
    }

    /// Records the fault and mounts its mock, unless the listener is closed (a reopen mounts it).
    pub(crate) fn inject_fault(&self, spec: FaultSpec) -> Result<(), Error> {
        let server = self.server();
        let id = {
            let mut world = self.shared.lock();
            let journal_seq = world.journal.last_seq();
            world.faults.inject(spec.clone(), journal_seq)?
        };
        if let (Some(server), Some(mock)) = (
            server.as_ref(),
            crate::routes::fault_mock(&self.shared, id, &spec),
        ) {
            mount(server, mock);
        }
        Ok(())
    }

    /// Closes (`true`) or reopens (`false`) the listener; returns once connecting fails or the
    /// routes are mounted again.
    pub(crate) async fn set_unreachable(&self, unreachable: bool) -> Result<(), Error> {
        let _one_change_at_a_time = self.reachability.lock().await;
        if unreachable {
            let Some(running) = self.server().take() else {
                return Ok(());
            };
            stop(running);
            wait_until_closed(self.addr).await?;
        } else {
            if self.server().is_some() {
                return Ok(());
            }
            let listener = bind_with_retry(self.addr).await?;
            self.open(listener).await;
        }
        tracing::info!(unreachable, addr = %self.addr, "coderd listener reachability changed");
        Ok(())
    }
}

impl Drop for CoderdListener {
    fn drop(&mut self) {
        if let Some(server) = self.server().take() {
            stop(server);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tokio task that has spent its cooperative budget (here: 200 ready semaphore permits
    /// without yielding) still mounts a mock and stops the server; before, both blocked for
    /// ever.
    #[test]
    fn mounting_and_stopping_from_a_task_that_spent_its_budget_end() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let server = MockServer::builder().start().await;
                let permits = tokio::sync::Semaphore::new(1_000);
                for _ in 0..200 {
                    let _spent = futures::FutureExt::now_or_never(permits.acquire());
                }
                mount(
                    &server,
                    Mock::given(wiremock::matchers::any())
                        .respond_with(wiremock::ResponseTemplate::new(200)),
                );
                stop(server);
            });
            let _ = done.send(());
        });
        finished
            .recv_timeout(Duration::from_secs(10))
            .expect("mount and stop returned");
    }
}
