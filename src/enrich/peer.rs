//! The process at the other end of a loopback TCP connection: its socket is the row of
//! `<proc_root>/net/tcp` (or `tcp6`) whose local address is the connection's peer address and
//! whose remote address is ours; the row's inode is then looked for among the
//! `<proc_root>/<pid>/fd/*` links (`socket:[inode]`). This is how a span whose resource names no
//! process is still tied to its sender, as long as the sender shares gpulse's network namespace
//! (same pod or host) and gpulse may read the sender's `fd` directory (same user, or
//! `CAP_SYS_PTRACE`).
//!
//! Scanning every process's descriptors is the costly part (about a millisecond per thousand
//! descriptors), so [`PeerCache`] keeps each connection's answer for a while.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::attribution::procfs::list_pids;

/// How long one connection's answer is reused. A connection's peer does not change; the bound
/// only keeps a reused ephemeral port from naming a process that has gone.
const TTL: Duration = Duration::from_secs(120);
/// Connections remembered; beyond it, the expired (else all) entries are dropped.
const MAX_ENTRIES: usize = 4096;

/// Parses one address column of `/proc/net/tcp{,6}`: `0100007F:1F90` (the address as the
/// kernel's native-endian words, the port in host order).
pub(crate) fn parse_proc_addr(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = addr.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The inode of the socket with `local` as its local and `remote` as its remote address, from
/// the text of `/proc/net/tcp` or `tcp6`.
pub(crate) fn find_socket_inode(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let same = |a: SocketAddr, b: SocketAddr| {
        a.port() == b.port() && canonical(a.ip()) == canonical(b.ip())
    };
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let l = parse_proc_addr(fields.get(1)?)?;
        let r = parse_proc_addr(fields.get(2)?)?;
        (same(l, local) && same(r, remote))
            .then(|| fields.get(9)?.parse().ok())
            .flatten()
    })
}

/// IPv4-mapped IPv6 (`::ffff:127.0.0.1`) as plain IPv4, so a dual-stack listener's view and the
/// client's table row compare equal.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The PID holding socket `inode` open, from `<proc_root>/<pid>/fd`.
pub(crate) fn pid_holding_socket(proc_root: &Path, inode: u64) -> Option<u32> {
    let wanted = format!("socket:[{inode}]");
    let own = std::process::id();
    list_pids(proc_root).ok()?.into_iter().find(|&pid| {
        // gpulse holds the other end of the connection, never the peer's socket.
        if pid == own {
            return false;
        }
        let Ok(entries) = std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")) else {
            return false;
        };
        entries.flatten().any(|entry| {
            std::fs::read_link(entry.path())
                .is_ok_and(|target| target.as_os_str() == wanted.as_str())
        })
    })
}

/// The PID of the process that opened the connection from `peer` to our `local` address.
pub(crate) fn resolve_peer(proc_root: &Path, local: SocketAddr, peer: SocketAddr) -> Option<u32> {
    if !canonical(peer.ip()).is_loopback() && canonical(peer.ip()) != canonical(local.ip()) {
        // A remote host's process is not in our tables.
        return None;
    }
    for table in ["net/tcp", "net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(proc_root.join(table)) else {
            continue;
        };
        if let Some(inode) = find_socket_inode(&text, peer, local) {
            return pid_holding_socket(proc_root, inode);
        }
    }
    None
}

/// (our address, peer address) → (peer PID, when it was looked up).
type PeerMap = HashMap<(SocketAddr, SocketAddr), (Option<u32>, Instant)>;

/// Remembers each connection's peer PID (or that it has none).
#[derive(Debug, Default)]
pub(crate) struct PeerCache {
    entries: Mutex<PeerMap>,
}

impl PeerCache {
    /// The cached answer for the connection `peer` → `local`, when there is a fresh one:
    /// `Some(None)` says the connection has no known peer process.
    pub(crate) fn cached(&self, local: SocketAddr, peer: SocketAddr) -> Option<Option<u32>> {
        let now = Instant::now();
        self.lock()
            .get(&(local, peer))
            .filter(|(_, at)| now.duration_since(*at) < TTL)
            .map(|(pid, _)| *pid)
    }

    /// The cached answer for the connection `peer` → `local`, computed with `resolve` when
    /// missing or stale.
    pub(crate) fn get_or_resolve(
        &self,
        local: SocketAddr,
        peer: SocketAddr,
        resolve: impl FnOnce() -> Option<u32>,
    ) -> Option<u32> {
        let now = Instant::now();
        if let Some((pid, at)) = self.lock().get(&(local, peer)) {
            if now.duration_since(*at) < TTL {
                return *pid;
            }
        }
        let pid = resolve();
        let mut entries = self.lock();
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, (_, at)| now.duration_since(*at) < TTL);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert((local, peer), (pid, now));
        pid
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PeerMap> {
        // Plain map operations only; a panic elsewhere leaves it usable.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_addresses_parse() {
        // The kernel prints the address as native-endian words.
        let v4 = format!("{:08X}:1F90", u32::from_ne_bytes([127, 0, 0, 1]));
        assert_eq!(
            parse_proc_addr(&v4),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        let mapped: Vec<String> = [
            [0u8, 0, 0, 0],
            [0, 0, 0, 0],
            [0, 0, 0xff, 0xff],
            [127, 0, 0, 1],
        ]
        .iter()
        .map(|w| format!("{:08X}", u32::from_ne_bytes(*w)))
        .collect();
        let v6 = format!("{}:0050", mapped.concat());
        assert_eq!(
            parse_proc_addr(&v6),
            Some("[::ffff:127.0.0.1]:80".parse().unwrap())
        );
        assert_eq!(parse_proc_addr("zz:1"), None);
        assert_eq!(parse_proc_addr("0100007F"), None);
    }

    #[test]
    fn the_row_of_the_peer_socket_gives_its_inode() {
        let hex = |a: [u8; 4], port: u16| format!("{:08X}:{port:04X}", u32::from_ne_bytes(a));
        let lo = [127, 0, 0, 1];
        let table = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             \x20  0: {} {} 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0\n\
             \x20  1: {} {} 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 20 4 30 10 -1\n\
             \x20  2: {} {} 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0 20 4 30 10 -1\n",
            hex(lo, 4318),
            hex([0, 0, 0, 0], 0),
            hex(lo, 4318),
            hex(lo, 50000),
            hex(lo, 50000),
            hex(lo, 4318),
        );
        let server: SocketAddr = "127.0.0.1:4318".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:50000".parse().unwrap();
        assert_eq!(find_socket_inode(&table, client, server), Some(333));
        assert_eq!(find_socket_inode(&table, server, client), Some(222));
        let other: SocketAddr = "127.0.0.1:50001".parse().unwrap();
        assert_eq!(find_socket_inode(&table, other, server), None);
    }

    #[test]
    fn a_real_loopback_connection_resolves_to_this_process_when_not_excluded() {
        // Both ends are in this test process; the socket inode lookup itself must work.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(server).unwrap();
        let (_accepted, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let inode = find_socket_inode(&table, peer, server).expect("the client's row");
        let link = format!("socket:[{inode}]");
        let holds = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == link.as_str()));
        assert!(holds, "this process holds {link}");
        // resolve_peer skips gpulse's own PID, so the same-process case finds nobody.
        assert_eq!(resolve_peer(Path::new("/proc"), server, peer), None);
    }

    #[test]
    fn the_cache_resolves_once_per_connection() {
        let cache = PeerCache::default();
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let mut calls = 0;
        for _ in 0..3 {
            let pid = cache.get_or_resolve(a, b, || {
                calls += 1;
                Some(7)
            });
            assert_eq!(pid, Some(7));
        }
        assert_eq!(calls, 1);
    }
}
