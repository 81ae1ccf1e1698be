//! Connections per client address, capped like nginx's `limit_conn`: one
//! client holding every connection the gateway serves would leave everyone
//! else waiting in the accept queue.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

/// The open connections of each client address.
#[derive(Clone, Default)]
pub struct PerIp {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection counted against its address until dropped.
pub struct Counted {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    client: IpAddr,
}

/// What a connection is counted under: its address, or the /64 network of
/// an IPv6 one, which one client (one LAN, one host) holds whole.
fn client(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let net = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(net))
        }
        v4 => v4,
    }
}

impl PerIp {
    /// Counts a connection from `ip`, or `None` when its address already
    /// holds `cap`.
    pub fn admit(&self, ip: IpAddr, cap: usize) -> Option<Counted> {
        let client = client(ip);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(client).or_insert(0);
        if *count >= cap {
            return None;
        }
        *count += 1;
        Some(Counted {
            open: Arc::clone(&self.open),
            client,
        })
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        // The entry goes with the last connection, so the map holds at most
        // one entry per connection open.
        if let Some(count) = open.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_the_cap_and_gets_its_room_back() {
        let per_ip = PerIp::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let held: Vec<Counted> = (0..3).filter_map(|_| per_ip.admit(a, 3)).collect();
        assert_eq!(held.len(), 3);
        assert!(per_ip.admit(a, 3).is_none());
        assert!(per_ip.admit("192.0.2.2".parse().unwrap(), 3).is_some());
        drop(held);
        assert!(per_ip.open.lock().unwrap().is_empty());
        assert!(per_ip.admit(a, 3).is_some());
    }

    #[test]
    fn an_ipv6_network_counts_as_one_client() {
        let per_ip = PerIp::default();
        let one = per_ip.admit("2001:db8:0:1::1".parse().unwrap(), 1);
        assert!(one.is_some());
        assert!(
            per_ip
                .admit("2001:db8:0:1::2".parse().unwrap(), 1)
                .is_none()
        );
        assert!(
            per_ip
                .admit("2001:db8:0:2::1".parse().unwrap(), 1)
                .is_some()
        );
        let mapped = per_ip.admit("::ffff:192.0.2.1".parse().unwrap(), 1);
        assert!(mapped.is_some());
        assert!(per_ip.admit("192.0.2.1".parse().unwrap(), 1).is_none());
    }
}
