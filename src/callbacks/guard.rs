//! Where a callback may go: never to a loopback, private, link-local,
//! unique-local (or unspecified, shared, multicast, broadcast) address,
//! nor to the special ranges that reach one of those or a test network
//! (192.0.0.0/24, 198.18.0.0/15, site-local fec0::/10, local-use NAT64
//! 64:ff9b:1::/48, 6to4 2002::/16, IPv4-compatible `::a.b.c.d`), unless
//! `callbacks.allow_networks` names its network.
//!
//! The check is on the address the connection is made to: names are
//! resolved by [`Guard`] itself (the callbacks client's DNS resolver), so
//! a name that resolves to a public address when checked and to a private
//! one when connecting (DNS rebinding) cannot get through; a URL with an
//! address in it is checked by [`Guard::check_url`] before sending. The
//! callbacks client uses no proxy (a proxy would resolve for us).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// The resolver and checker of callback destinations.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    allow: Arc<Vec<IpNet>>,
}

/// A destination refused, with the reason a person reads.
#[derive(Debug)]
pub struct Refused {
    pub host: String,
    pub addr: IpAddr,
    pub range: &'static str,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Refused { host, addr, range } = self;
        if host.trim_start_matches('[').trim_end_matches(']') == addr.to_string() {
            write!(f, "callback destination {host} is a {range} address")?;
        } else {
            write!(f, "callback destination {host} is {addr}, a {range} address")?;
        }
        f.write_str("; refused (add its network to callbacks.allow_networks to allow it)")
    }
}

impl std::error::Error for Refused {}

impl Guard {
    pub fn new(allow: Vec<IpNet>) -> Guard {
        Guard { allow: Arc::new(allow) }
    }

    /// Refuses `addr` when it is in a guarded range that no allowed network holds.
    pub fn check(&self, host: &str, addr: IpAddr) -> Result<(), Refused> {
        let Some(range) = guarded_range(addr) else {
            return Ok(());
        };
        if self
            .allow
            .iter()
            .any(|n| n.contains(&addr) || n.contains(&canonical(addr)))
        {
            return Ok(());
        }
        Err(Refused {
            host: host.to_owned(),
            addr,
            range,
        })
    }

    /// For a URL whose host is an address (no resolution happens for it).
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), Refused> {
        let host = url.host_str().unwrap_or_default();
        match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(addr) => self.check(host, addr),
            Err(_) => Ok(()),
        }
    }
}

impl Resolve for Guard {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match guard.check(&host, a.ip()) {
                    Ok(()) => true,
                    Err(r) => {
                        refused.get_or_insert(r);
                        false
                    }
                })
                .collect();
            match (allowed.is_empty(), refused) {
                (true, Some(r)) => Err(Box::new(r) as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(allowed.into_iter()) as Addrs),
            }
        })
    }
}

/// An IPv4 address written as IPv6 (`::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`)
/// is checked as the IPv4 address.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    (s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0]).then(|| {
        let o = v6.octets();
        Ipv4Addr::new(o[12], o[13], o[14], o[15])
    })
}

/// The guarded range `addr` is in, if any.
pub fn guarded_range(addr: IpAddr) -> Option<&'static str> {
    match canonical(addr) {
        IpAddr::V4(a) => {
            let o = a.octets();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_private() {
                Some("private")
            } else if a.is_link_local() {
                Some("link-local")
            } else if a.is_unspecified() || o[0] == 0 {
                Some("unspecified")
            } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
                Some("shared (carrier-grade NAT)")
            } else if o[..3] == [192, 0, 0] {
                Some("protocol-assignment (192.0.0.0/24)")
            } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
                Some("benchmarking (198.18.0.0/15)")
            } else if a.is_multicast() || a.is_broadcast() || o[0] >= 240 {
                Some("multicast or reserved")
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            let first = s[0];
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_unspecified() {
                Some("unspecified")
            } else if s[..6] == [0; 6] {
                Some("IPv4-compatible (::a.b.c.d)")
            } else if (first & 0xfe00) == 0xfc00 {
                Some("unique-local")
            } else if (first & 0xffc0) == 0xfe80 {
                Some("link-local")
            } else if (first & 0xffc0) == 0xfec0 {
                Some("site-local")
            } else if s[..3] == [0x64, 0xff9b, 1] {
                Some("local-use NAT64 (64:ff9b:1::/48)")
            } else if first == 0x2002 {
                Some("6to4 (2002::/16)")
            } else if a.is_multicast() {
                Some("multicast or reserved")
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn guarded_ranges() {
        for (a, range) in [
            ("127.0.0.1", "loopback"),
            ("10.2.3.4", "private"),
            ("172.31.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("100.64.0.1", "shared (carrier-grade NAT)"),
            ("::1", "loopback"),
            ("fd00::1", "unique-local"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("192.0.0.8", "protocol-assignment (192.0.0.0/24)"),
            ("198.18.0.1", "benchmarking (198.18.0.0/15)"),
            ("198.19.255.254", "benchmarking (198.18.0.0/15)"),
            ("fec0::1", "site-local"),
            ("feff::1", "site-local"),
            ("64:ff9b:1::a00:1", "local-use NAT64 (64:ff9b:1::/48)"),
            ("2002:7f00:1::1", "6to4 (2002::/16)"),
            ("::127.0.0.1", "IPv4-compatible (::a.b.c.d)"),
            ("::8.8.8.8", "IPv4-compatible (::a.b.c.d)"),
        ] {
            assert_eq!(guarded_range(ip(a)), Some(range), "{a}");
        }
        for a in [
            "93.184.216.34",
            "172.32.0.1",
            "100.128.0.1",
            "192.0.1.1",
            "198.20.0.1",
            "64:ff9b:2::1",
            "2001:db8::1",
            "2606:4700::1111",
        ] {
            assert_eq!(guarded_range(ip(a)), None, "{a}");
        }
    }

    #[test]
    fn the_allow_list_opens_exactly_its_networks() {
        let g = Guard::new(vec!["127.0.0.0/8".parse().unwrap(), "fd00::/64".parse().unwrap()]);
        assert!(g.check("h", ip("127.0.0.1")).is_ok());
        assert!(g.check("h", ip("::ffff:127.0.0.1")).is_ok());
        assert!(g.check("h", ip("fd00::5")).is_ok());
        let e = g.check("h", ip("10.0.0.1")).unwrap_err();
        assert!(e.to_string().contains("10.0.0.1, a private address"), "{e}");
        assert!(g.check("h", ip("fd00:0:0:1::5")).is_err());
    }
}
