//! A replica's own network and UTS namespaces on the suite's host (local tier, as root).
//!
//! Operators as shipped bind fixed ports (controller-runtime's `:8080` metrics and `:8081`
//! health) and take their Lease identity from the host name (`<hostname>_<uuid>`). Two replicas
//! on one host would collide on the ports and share a host name. In a sandbox each replica binds
//! its ports in a network namespace of its own and has its own host name, the replica's name, as
//! in a pod. The loopback addresses the operator needs (the API server, coderd) are forwarded into
//! the namespace at the same address, so its kubeconfig and the control plane's URL work as they are.
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use anyhow::Context;
use nix::sched::CloneFlags;
use tokio::task::JoinHandle;

pub struct Sandbox {
    network: OwnedFd,
    host_name: OwnedFd,
    forwarders: Vec<JoinHandle<()>>,
}

impl Sandbox {
    /// New namespaces with `host_name`, where each of `forward` (loopback addresses of this
    /// host) is reachable at the same address. Fails without the right to create namespaces
    /// (not root, or a container that forbids it).
    pub async fn create(host_name: &str, forward: &[SocketAddr]) -> anyhow::Result<Self> {
        let host_name = host_name.to_owned();
        let addresses = forward.to_vec();
        // Namespaces belong to a thread: a thread of its own enters them, binds the listeners
        // there (a socket stays in the namespace it was made in) and ends.
        let (network, uts, listeners) =
            tokio::task::spawn_blocking(move || enter_new_namespaces(&host_name, &addresses))
                .await
                .context("the namespace thread panicked")??;
        let mut forwarders = Vec::new();
        for (listener, target) in listeners.into_iter().zip(forward.iter().copied()) {
            listener.set_nonblocking(true)?;
            let listener = tokio::net::TcpListener::from_std(listener)?;
            forwarders.push(tokio::spawn(forward_connections(listener, target)));
        }
        Ok(Self {
            network,
            host_name: uts,
            forwarders,
        })
    }

    /// Makes `command` start inside the sandbox.
    pub fn enter_on_exec(&self, command: &mut tokio::process::Command) {
        let (network, host_name) = (self.network.as_raw_fd(), self.host_name.as_raw_fd());
        // SAFETY: between fork and exec the closure only calls setns(2), which is
        // async-signal-safe; it allocates nothing and touches no locks. The descriptors stay
        // open in the parent while the command is spawned (the sandbox outlives the spawn).
        unsafe {
            command.pre_exec(move || {
                for (fd, kind) in [
                    (network, libc::CLONE_NEWNET),
                    (host_name, libc::CLONE_NEWUTS),
                ] {
                    if libc::setns(fd, kind) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for forwarder in &self.forwarders {
            forwarder.abort();
        }
    }
}

type Entered = (OwnedFd, OwnedFd, Vec<std::net::TcpListener>);

fn enter_new_namespaces(host_name: &str, forward: &[SocketAddr]) -> anyhow::Result<Entered> {
    nix::sched::unshare(CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWUTS)
        .context("creating network and UTS namespaces (unshare)")?;
    nix::unistd::sethostname(host_name).context("setting the host name")?;
    loopback_up().context("bringing up the loopback interface")?;
    let open = |kind: &str| -> anyhow::Result<OwnedFd> {
        let path = format!("/proc/thread-self/ns/{kind}");
        Ok(std::fs::File::open(&path)
            .with_context(|| format!("opening {path}"))?
            .into())
    };
    let (network, uts) = (open("net")?, open("uts")?);
    let listeners = forward
        .iter()
        .map(|address| {
            std::net::TcpListener::bind(address)
                .with_context(|| format!("listening on {address} inside the namespace"))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok((network, uts, listeners))
}

/// `ip link set lo up`: a new network namespace starts with its loopback interface down.
fn loopback_up() -> std::io::Result<()> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
    // SAFETY: `ifreq` is plain data (zero is a valid value); the name is NUL-terminated within
    // its array; SIOCGIFFLAGS/SIOCSIFFLAGS read and write `ifru_flags` only.
    unsafe {
        let mut request: libc::ifreq = std::mem::zeroed();
        for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *slot = *byte as libc::c_char;
        }
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Each connection accepted inside the namespace is joined to `target` outside it.
async fn forward_connections(listener: tokio::net::TcpListener, target: SocketAddr) {
    while let Ok((mut inside, _)) = listener.accept().await {
        tokio::spawn(async move {
            if let Ok(mut outside) = tokio::net::TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Two sandboxes: each binds a port the host holds, has its own host name, and reaches a
    /// listener of the host through the forwarded address.
    #[tokio::test]
    async fn replicas_bind_a_held_port_each_with_their_own_host_name() {
        // SAFETY: geteuid(2) cannot fail and touches no memory.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: creating namespaces needs root (the suite then shares the host)");
            return;
        }
        let host = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = host.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = host.accept().await {
                let _ = stream.write_all(b"host").await;
            }
        });
        let held = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let held_port = held.local_addr().unwrap().port();
        let mut outputs = Vec::new();
        for name in ["replica-a", "replica-b"] {
            let sandbox = Sandbox::create(name, &[address]).await.unwrap();
            let script = format!(
                "hostname; exec 3<>/dev/tcp/127.0.0.1/{}; head -c 4 <&3; echo; \
                 python3 -c 'import socket,time; s=socket.socket(); s.bind((\"0.0.0.0\", {held_port})); print(\"bound\")'",
                address.port()
            );
            let mut command = tokio::process::Command::new("bash");
            command.args(["-c", &script]);
            sandbox.enter_on_exec(&mut command);
            let output = command.output().await.unwrap();
            assert!(output.status.success(), "{output:?}");
            outputs.push(String::from_utf8(output.stdout).unwrap());
        }
        assert_eq!(
            outputs,
            ["replica-a\nhost\nbound\n", "replica-b\nhost\nbound\n"]
        );
        let mut probe = tokio::net::TcpStream::connect(address).await.unwrap();
        let mut greeting = [0u8; 4];
        probe.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting, b"host", "the host's own listener still answers");
        drop(held);
    }
}
