//! What the end-to-end tests on the default testbed (client — middlebox —
//! server, `sidecore testbed up --prefix P`) share: probing which UDP ports
//! get through, and whether the middlebox has an XDP program attached.

use sidecore_testbed::testing::udp_reaches;

/// The ports of `ports` whose datagram from the client (10.201.0.1) reached
/// the server (10.201.1.2) of testbed `prefix`.
pub fn probe(prefix: &str, ports: &[u16]) -> Vec<u16> {
    udp_reaches(
        prefix,
        [10, 201, 0, 1].into(),
        [10, 201, 1, 2].into(),
        ports,
    )
}

pub fn xdp_attached(prefix: &str) -> bool {
    sidecore_testbed::topology::ip(&[
        "-n",
        &format!("{prefix}-middlebox"),
        "link",
        "show",
        "dev",
        "to-client",
    ])
    .unwrap()
    .contains("xdp")
}
