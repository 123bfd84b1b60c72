//! The host's own network addresses.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Every address of every interface of this network namespace
/// (`getifaddrs`), without duplicates.
pub fn interface_addresses() -> io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head it allocated into `head`.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet
        // freed; its fields are read only.
        let (next, addr) = unsafe { ((*cur).ifa_next, (*cur).ifa_addr) };
        if !addr.is_null() {
            // SAFETY: a non-null ifa_addr points at a sockaddr whose family
            // says which sockaddr_* it is, and is as large as that type.
            let ip = unsafe {
                match i32::from((*addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(addr as *const libc::sockaddr_in);
                        Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))))
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(addr as *const libc::sockaddr_in6);
                        Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
                    }
                    _ => None,
                }
            };
            if let Some(ip) = ip.filter(|ip| !out.contains(ip)) {
                out.push(ip);
            }
        }
        cur = next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_among_the_interface_addresses() {
        let addrs = interface_addresses().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            addrs.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{addrs:?}"
        );
    }
}
