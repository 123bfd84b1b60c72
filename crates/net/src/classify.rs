//! Which addresses the proxy refuses unless the allowlist names them.
//!
//! A name on the allowlist says "this service", not "whatever this name
//! resolves to today": a name that resolves to the host's loopback, a private
//! network or a cloud metadata service is how DNS rebinding reaches what the
//! sandbox must not. So every resolved address is classified, and only public
//! ones are connected to unless the address itself is listed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Cloud metadata services (AWS, GCP, Azure, Alibaba, Oracle, ...).
const METADATA_V4: [Ipv4Addr; 4] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(168, 63, 129, 16),
    Ipv4Addr::new(192, 0, 0, 192),
];

/// AWS's IPv6 metadata endpoint.
const METADATA_V6: [Ipv6Addr; 1] = [Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)];

/// Why `ip` is refused unless listed, or `None` for a public address.
///
/// The classes, checked in this order:
/// - `metadata-address`: 169.254.169.254, fd00:ec2::254, 100.100.100.200,
///   168.63.129.16, 192.0.0.192;
/// - `loopback-address`: 127.0.0.0/8, ::1;
/// - `unspecified-address`: 0.0.0.0/8, ::;
/// - `private-address`: 10/8, 172.16/12, 192.168/16, 100.64/10 (carrier-grade
///   NAT), 192.0.0/24, 198.18/15, fc00::/7, fec0::/10 (site-local),
///   64:ff9b:1::/48 (local-use NAT64);
/// - `link-local-address`: 169.254/16, fe80::/10;
/// - `multicast-or-reserved`: 224/4, 240/4, 255.255.255.255, ff00::/8,
///   100::/64 (discard-only).
///
/// An IPv6 address that embeds an IPv4 one (v4-mapped `::ffff:a.b.c.d`,
/// v4-compatible `::a.b.c.d`, IPv4-translated `::ffff:0:a.b.c.d`, NAT64
/// `64:ff9b::/96`, 6to4 `2002::/16`) is
/// classified as the embedded address, so `::ffff:127.0.0.1` is loopback.
/// The documentation ranges (192.0.2/24, 198.51.100/24, 203.0.113/24,
/// 2001:db8::/32) count as public.
pub fn classify(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<&'static str> {
    if METADATA_V4.contains(&ip) {
        return Some("metadata-address");
    }
    let [a, b, c, _] = ip.octets();
    if a == 127 {
        return Some("loopback-address");
    }
    if a == 0 {
        return Some("unspecified-address");
    }
    let private = a == 10
        || (a == 172 && (16..=31).contains(&b))
        || (a == 192 && b == 168)
        || (a == 100 && (64..=127).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19));
    if private {
        return Some("private-address");
    }
    if a == 169 && b == 254 {
        return Some("link-local-address");
    }
    if a >= 224 {
        // 224/4 multicast, 240/4 reserved, 255.255.255.255 broadcast.
        return Some("multicast-or-reserved");
    }
    None
}

fn classify_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if METADATA_V6.contains(&ip) {
        return Some("metadata-address");
    }
    if ip == Ipv6Addr::LOCALHOST {
        return Some("loopback-address");
    }
    if ip == Ipv6Addr::UNSPECIFIED {
        return Some("unspecified-address");
    }
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    let s = ip.segments();
    if s[0] & 0xfe00 == 0xfc00
        || s[0] & 0xffc0 == 0xfec0
        || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
    {
        return Some("private-address");
    }
    if s[0] & 0xffc0 == 0xfe80 {
        return Some("link-local-address");
    }
    if s[0] & 0xff00 == 0xff00 || (s[0] == 0x100 && s[1] == 0 && s[2] == 0 && s[3] == 0) {
        return Some("multicast-or-reserved");
    }
    None
}

/// The IPv4 address an IPv6 one carries, for the forms a host or a
/// translator on its path may route as IPv4: v4-mapped, v4-compatible,
/// IPv4-translated, NAT64 (well-known prefix) and 6to4.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let low = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    let first_five_zero = s[..5].iter().all(|&x| x == 0);
    if first_five_zero && (s[5] == 0xffff || s[5] == 0) {
        // ::ffff:a.b.c.d and the deprecated ::a.b.c.d (:: and ::1 are
        // handled before this is asked).
        return Some(low);
    }
    if s[..4].iter().all(|&x| x == 0) && s[4] == 0xffff && s[5] == 0 {
        // ::ffff:0:a.b.c.d, IPv4-translated (SIIT, RFC 2765).
        return Some(low);
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6].iter().all(|&x| x == 0) {
        return Some(low);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    None
}

/// `ip` with a v4-mapped IPv6 address (`::ffff:a.b.c.d`) turned into the
/// IPv4 address it means, so that one address has one spelling.
pub(crate) fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn c(s: &str) -> Option<&'static str> {
        classify(s.parse().unwrap())
    }

    #[test]
    fn every_metadata_address_is_classified_before_its_range() {
        for a in [
            "169.254.169.254",
            "fd00:ec2::254",
            "100.100.100.200",
            "168.63.129.16",
            "192.0.0.192",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
        ] {
            assert_eq!(c(a), Some("metadata-address"), "{a}");
        }
    }

    #[test]
    fn loopback_and_unspecified() {
        for a in [
            "127.0.0.1",
            "127.255.0.9",
            "::1",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
        ] {
            assert_eq!(c(a), Some("loopback-address"), "{a}");
        }
        for a in ["0.0.0.0", "0.1.2.3", "::", "::ffff:0.0.0.0"] {
            assert_eq!(c(a), Some("unspecified-address"), "{a}");
        }
    }

    #[test]
    fn private_ranges() {
        for a in [
            "10.0.0.1",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.0.8",
            "198.18.0.1",
            "198.19.255.255",
            "fc00::1",
            "fd12:3456::1",
            "fec0::1",
            "64:ff9b:1::1",
            "::ffff:10.0.0.7",
            "64:ff9b::10.1.2.3",
            "2002:c0a8:0101::1",
        ] {
            assert_eq!(c(a), Some("private-address"), "{a}");
        }
        for a in [
            "172.15.255.255",
            "172.32.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "198.20.0.0",
        ] {
            assert_eq!(c(a), None, "{a}");
        }
    }

    #[test]
    fn link_local_multicast_and_reserved() {
        for a in ["169.254.0.1", "169.254.169.253", "fe80::1", "febf::1"] {
            assert_eq!(c(a), Some("link-local-address"), "{a}");
        }
        for a in [
            "224.0.0.1",
            "239.255.255.255",
            "240.0.0.1",
            "255.255.255.255",
            "ff02::1",
            "100::1",
            "::ffff:224.0.0.1",
        ] {
            assert_eq!(c(a), Some("multicast-or-reserved"), "{a}");
        }
    }

    #[test]
    fn ipv4_translated_embedding_of_a_refused_address_is_refused_as_that_address() {
        assert_eq!(c("::ffff:0:127.0.0.1"), Some("loopback-address"));
        assert_eq!(c("::ffff:0:a9fe:a9fe"), Some("metadata-address"));
        assert_eq!(c("::ffff:0:10.1.2.3"), Some("private-address"));
        assert_eq!(c("::ffff:0:203.0.113.9"), None);
    }

    #[test]
    fn public_and_documentation_addresses_are_public() {
        for a in [
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "8.8.8.8",
            "2001:db8::1",
            "2606:4700::1111",
            "::ffff:203.0.113.9",
            "64:ff9b::203.0.113.9",
            "2002:cb00:7109::1",
        ] {
            assert_eq!(c(a), None, "{a}");
        }
    }

    #[test]
    fn normalize_turns_v4_mapped_into_v4() {
        assert_eq!(
            normalize("::ffff:10.0.0.5".parse().unwrap()),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            normalize("fd00::1".parse().unwrap()),
            "fd00::1".parse::<IpAddr>().unwrap()
        );
    }
}
