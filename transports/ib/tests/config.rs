//! The transport's configuration and pure decisions: HCA filter syntax and
//! selection, GID choice, numeric variables with their NCCL aliases, the
//! fallback rule, and the endpoint's wire form. No device needed.

use std::collections::HashMap;

use ferroccl_ib::{
    choose_gid, decide, select_ports, ConfigError, Decision, Endpoint, EndpointError, Gid, GidKind,
    HcaItem, HcaSpec, IbConfig, LinkLayer, Port, ProbeError,
};

fn cfg(vars: &[(&str, &str)]) -> Result<IbConfig, ConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    IbConfig::from_lookup(|name| map.get(name).cloned())
}

fn item(name: &str, port: Option<u8>) -> HcaItem {
    HcaItem {
        name: name.to_string(),
        port,
    }
}

fn port(device: &str, n: u8, active: bool, link: LinkLayer) -> Port {
    Port {
        device: device.to_string(),
        port: n,
        active,
        link_layer: link,
        lid: if link == LinkLayer::Infiniband { 7 } else { 0 },
        mtu: 4096,
        gids: Vec::new(),
    }
}

fn names(ports: &[Port]) -> Vec<String> {
    ports
        .iter()
        .map(|p| format!("{}:{}", p.device, p.port))
        .collect()
}

fn fabric() -> Vec<Port> {
    vec![
        port("mlx5_0", 1, true, LinkLayer::Infiniband),
        port("mlx5_1", 1, true, LinkLayer::Infiniband),
        port("mlx5_1", 2, false, LinkLayer::Infiniband),
        port("mlx5_10", 1, true, LinkLayer::Ethernet),
        port("rxe0", 1, true, LinkLayer::Ethernet),
    ]
}

fn parse(v: &str) -> HcaSpec {
    HcaSpec::parse("FERROCCL_IB_HCA", v).unwrap()
}

#[test]
fn hca_syntax() {
    assert_eq!(parse(""), HcaSpec::default());
    assert_eq!(parse("  "), HcaSpec::default());
    let s = parse("mlx5_0:1,mlx5_1");
    assert!(!s.exclude && !s.exact);
    assert_eq!(s.items, vec![item("mlx5_0", Some(1)), item("mlx5_1", None)]);
    let s = parse("^mlx5_0");
    assert!(s.exclude && !s.exact);
    let s = parse("=mlx5_0:2");
    assert!(!s.exclude && s.exact);
    assert_eq!(s.items, vec![item("mlx5_0", Some(2))]);
    let s = parse("^=mlx5_0, mlx5_1 : 1");
    assert!(s.exclude && s.exact);
    assert_eq!(s.items, vec![item("mlx5_0", None), item("mlx5_1", Some(1))]);
    assert_eq!(s.to_string(), "^=mlx5_0,mlx5_1:1");
}

#[test]
fn hca_syntax_errors_name_variable_and_item() {
    for (value, needle) in [
        ("mlx5_0,", "empty device name"),
        (",mlx5_0", "empty device name"),
        (":1", "empty device name"),
        ("^", "no device listed"),
        ("^=", "no device listed"),
        ("mlx5_0:x", "\"x\" is not a number"),
        ("mlx5_0:", "\"\" is not a number"),
        ("mlx5_0:0", "numbered from 1"),
        ("mlx5_0:256", "not a number from 1 to 255"),
        ("mlx5_0:-1", "not a number"),
    ] {
        let e = HcaSpec::parse("NCCL_IB_HCA", value).unwrap_err();
        assert_eq!(e.var, "NCCL_IB_HCA");
        assert_eq!(e.value, value);
        let msg = e.to_string();
        assert!(msg.contains("NCCL_IB_HCA"), "{msg}");
        assert!(msg.contains(needle), "{value}: {msg}");
    }
    let e = HcaSpec::parse("FERROCCL_IB_HCA", "a,mlx5_0:q").unwrap_err();
    assert!(e.to_string().contains("item \"mlx5_0:q\""), "{e}");
}

#[test]
fn select_all_active_in_order() {
    let got = select_ports(&HcaSpec::default(), &fabric()).unwrap();
    assert_eq!(names(&got), ["mlx5_0:1", "mlx5_1:1", "mlx5_10:1", "rxe0:1"]);
}

#[test]
fn select_prefix_exact_port_and_exclude() {
    let f = fabric();
    // Prefix: mlx5_1 also matches mlx5_10.
    let got = select_ports(&parse("mlx5_1"), &f).unwrap();
    assert_eq!(names(&got), ["mlx5_1:1", "mlx5_10:1"]);
    // Exact.
    let got = select_ports(&parse("=mlx5_1"), &f).unwrap();
    assert_eq!(names(&got), ["mlx5_1:1"]);
    // The list's order, each port once.
    let got = select_ports(&parse("rxe,mlx5_0,mlx5"), &f).unwrap();
    assert_eq!(names(&got), ["rxe0:1", "mlx5_0:1", "mlx5_1:1", "mlx5_10:1"]);
    // Port given.
    let got = select_ports(&parse("mlx5_0:1"), &f).unwrap();
    assert_eq!(names(&got), ["mlx5_0:1"]);
    // Exclude, prefix.
    let got = select_ports(&parse("^mlx5_1"), &f).unwrap();
    assert_eq!(names(&got), ["mlx5_0:1", "rxe0:1"]);
    // Exclude, exact.
    let got = select_ports(&parse("^=mlx5_1"), &f).unwrap();
    assert_eq!(names(&got), ["mlx5_0:1", "mlx5_10:1", "rxe0:1"]);
    // Exclude one port only.
    let got = select_ports(&parse("^=mlx5_0:1,rxe0"), &f).unwrap();
    assert_eq!(names(&got), ["mlx5_1:1", "mlx5_10:1"]);
}

#[test]
fn select_errors_say_what_was_found() {
    let f = fabric();
    // The only port 2 is down.
    let e = select_ports(&parse("mlx5_1:2"), &f).unwrap_err();
    let ProbeError::NoneMatched { spec, found } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(spec, "mlx5_1:2");
    assert!(
        found.contains("mlx5_1:2 (InfiniBand, not active)"),
        "{found}"
    );
    assert!(e.to_string().contains("FERROCCL_IB_HCA=mlx5_1:2"), "{e}");
    assert!(matches!(
        select_ports(&parse("=mlx5"), &f),
        Err(ProbeError::NoneMatched { .. })
    ));
    assert!(matches!(
        select_ports(&parse("^mlx5,rxe"), &f),
        Err(ProbeError::NoneMatched { .. })
    ));
    let down = vec![port("mlx5_0", 1, false, LinkLayer::Ethernet)];
    let e = select_ports(&HcaSpec::default(), &down).unwrap_err();
    assert!(matches!(e, ProbeError::NoActivePort { .. }), "{e:?}");
    assert!(
        e.to_string().contains("mlx5_0:1 (Ethernet, not active)"),
        "{e}"
    );
    assert!(matches!(
        select_ports(&HcaSpec::default(), &[]),
        Err(ProbeError::NoDevice(_))
    ));
}

fn gid(index: u8, raw: [u8; 16], kind: GidKind) -> Gid {
    Gid { index, raw, kind }
}

const LINK_LOCAL: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
const V4: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
const V6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];

#[test]
fn gid_choice() {
    let mut p = port("mlx5_0", 1, true, LinkLayer::Ethernet);
    p.gids = vec![
        gid(0, LINK_LOCAL, GidKind::RoceV1),
        gid(1, LINK_LOCAL, GidKind::RoceV2),
        gid(2, V6, GidKind::RoceV1),
        gid(3, V6, GidKind::RoceV2),
        gid(4, V4, GidKind::RoceV1),
        gid(5, V4, GidKind::RoceV2),
    ];
    // RoCE v2 with an IPv4-mapped address first.
    assert_eq!(choose_gid(&p, None).unwrap().unwrap().index, 5);
    p.gids.retain(|g| g.index != 5);
    // Then RoCE v2 not link-local.
    assert_eq!(choose_gid(&p, None).unwrap().unwrap().index, 3);
    p.gids.retain(|g| g.index != 3);
    // Then any RoCE v2.
    assert_eq!(choose_gid(&p, None).unwrap().unwrap().index, 1);
    p.gids.retain(|g| g.index != 1);
    // Then RoCE v1, lowest index.
    assert_eq!(choose_gid(&p, None).unwrap().unwrap().index, 0);
    // Forced.
    assert_eq!(choose_gid(&p, Some(4)).unwrap().unwrap().index, 4);
    let e = choose_gid(&p, Some(9)).unwrap_err();
    assert_eq!(e.var, "FERROCCL_IB_GID_INDEX");
    assert!(e.why.contains("no valid GID at index 9"), "{e}");
    // Unknown types on Ethernet: the lowest index.
    p.gids = vec![gid(2, V6, GidKind::Unknown), gid(1, V4, GidKind::Unknown)];
    assert_eq!(choose_gid(&p, None).unwrap().unwrap().index, 1);

    // InfiniBand: index 0, else the lowest; none at all is fine (LID).
    let mut ib = port("mlx5_0", 1, true, LinkLayer::Infiniband);
    assert_eq!(choose_gid(&ib, None).unwrap(), None);
    ib.gids = vec![gid(3, V6, GidKind::Ib), gid(0, LINK_LOCAL, GidKind::Ib)];
    assert_eq!(choose_gid(&ib, None).unwrap().unwrap().index, 0);
    ib.gids.retain(|g| g.index != 0);
    assert_eq!(choose_gid(&ib, None).unwrap().unwrap().index, 3);
    // All-zero entries never count.
    ib.gids = vec![gid(0, [0; 16], GidKind::Ib)];
    assert_eq!(choose_gid(&ib, None).unwrap(), None);
}

#[test]
fn config_defaults() {
    let c = cfg(&[]).unwrap();
    assert_eq!(c, IbConfig::default());
    assert_eq!(c.hca, HcaSpec::default());
    assert_eq!(c.gid_index, None);
    assert_eq!(c.timeout, 20);
    assert_eq!(c.retry_cnt, 7);
    assert_eq!(c.qps_per_connection, 1);
}

#[test]
fn config_values_and_aliases() {
    let c = cfg(&[
        ("FERROCCL_IB_HCA", "=mlx5_0:1"),
        ("FERROCCL_IB_GID_INDEX", "3"),
        ("FERROCCL_IB_TIMEOUT", "31"),
        ("FERROCCL_IB_RETRY_CNT", "0"),
        ("FERROCCL_IB_QPS_PER_CONNECTION", "16"),
    ])
    .unwrap();
    assert_eq!(c.hca, parse("=mlx5_0:1"));
    assert_eq!(
        (c.gid_index, c.timeout, c.retry_cnt, c.qps_per_connection),
        (Some(3), 31, 0, 16)
    );
    // NCCL names when ours are unset (or empty).
    let c = cfg(&[
        ("NCCL_IB_HCA", "^mlx5_1"),
        ("NCCL_IB_GID_INDEX", "0"),
        ("FERROCCL_IB_TIMEOUT", ""),
        ("NCCL_IB_TIMEOUT", "1"),
        ("NCCL_IB_RETRY_CNT", "5"),
        ("NCCL_IB_QPS_PER_CONNECTION", "2"),
    ])
    .unwrap();
    assert_eq!(c.hca, parse("^mlx5_1"));
    assert_eq!(
        (c.gid_index, c.timeout, c.retry_cnt, c.qps_per_connection),
        (Some(0), 1, 5, 2)
    );
    // Ours wins over NCCL's.
    let c = cfg(&[("FERROCCL_IB_TIMEOUT", "14"), ("NCCL_IB_TIMEOUT", "x")]).unwrap();
    assert_eq!(c.timeout, 14);
}

#[test]
fn config_errors() {
    for (var, value, needle) in [
        ("FERROCCL_IB_TIMEOUT", "0", "out of range 1 to 31"),
        ("FERROCCL_IB_TIMEOUT", "32", "out of range 1 to 31"),
        ("NCCL_IB_TIMEOUT", "abc", "not a whole number"),
        ("FERROCCL_IB_RETRY_CNT", "8", "out of range 0 to 7"),
        ("FERROCCL_IB_RETRY_CNT", "-1", "out of range 0 to 7"),
        (
            "FERROCCL_IB_QPS_PER_CONNECTION",
            "0",
            "out of range 1 to 16",
        ),
        ("NCCL_IB_QPS_PER_CONNECTION", "17", "out of range 1 to 16"),
        ("FERROCCL_IB_GID_INDEX", "256", "out of range 0 to 255"),
        ("FERROCCL_IB_GID_INDEX", "1.5", "not a whole number"),
        ("NCCL_IB_HCA", "mlx5_0:0", "numbered from 1"),
    ] {
        let e = cfg(&[(var, value)]).unwrap_err();
        assert_eq!((e.var.as_str(), e.value.as_str()), (var, value));
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("{var}=")), "{msg}");
        assert!(msg.contains(needle), "{var}={value}: {msg}");
    }
}

#[test]
fn fallback_rule() {
    let ports = vec![port("mlx5_0", 1, true, LinkLayer::Infiniband)];
    assert_eq!(
        decide(false, Ok(ports.clone())),
        Decision::Use(ports.clone())
    );
    assert_eq!(decide(true, Ok(ports.clone())), Decision::Use(ports));

    let Decision::FallBack { reason } = decide(false, Err(ProbeError::NotBuilt)) else {
        panic!()
    };
    assert!(
        reason.contains("built without the `ib` feature"),
        "{reason}"
    );
    assert!(reason.contains("using TCP"), "{reason}");

    let cases = [
        (ProbeError::NotBuilt, "built without the `ib` feature"),
        (
            ProbeError::NoDevice("ibv_get_device_list listed none".into()),
            "no RDMA device found",
        ),
        (
            ProbeError::NoneMatched {
                spec: "=mlx5_9".into(),
                found: "mlx5_0:1 (InfiniBand, active)".into(),
            },
            "FERROCCL_IB_HCA==mlx5_9",
        ),
        (
            ProbeError::NoActivePort {
                found: "mlx5_0:1 (InfiniBand, not active)".into(),
            },
            "no active RDMA port",
        ),
    ];
    for (err, needle) in cases {
        let Decision::Fail { message } = decide(true, Err(err.clone())) else {
            panic!("{err:?}")
        };
        assert!(message.starts_with("FERROCCL_TRANSPORT=ib"), "{message}");
        assert!(message.contains(needle), "{message}");
        assert!(matches!(decide(false, Err(err)), Decision::FallBack { .. }));
    }
    assert!(matches!(decide(true, Ok(vec![])), Decision::Fail { .. }));
    assert!(matches!(
        decide(false, Ok(vec![])),
        Decision::FallBack { .. }
    ));
}

#[cfg(not(feature = "ib"))]
#[test]
fn probe_without_feature_says_so() {
    let e = ferroccl_ib::probe(&IbConfig::default()).unwrap_err();
    assert_eq!(e, ProbeError::NotBuilt);
    assert!(e.to_string().contains("built without the `ib` feature"));
}

fn endpoint() -> Endpoint {
    Endpoint {
        qpn: 0x00ab_cdef,
        psn: 0x0012_3456,
        lid: 0xbeef,
        gid: V4,
        port: 2,
        mtu: 1024,
    }
}

#[test]
fn endpoint_round_trip() {
    for mtu in [256, 512, 1024, 2048, 4096] {
        let e = Endpoint { mtu, ..endpoint() };
        let b = e.to_bytes();
        assert_eq!(b.len(), Endpoint::LEN);
        assert_eq!(Endpoint::from_bytes(&b), Ok(e));
    }
}

#[test]
fn endpoint_refusals() {
    let good = endpoint().to_bytes();
    for n in [0, 1, 31, 33, 64] {
        let mut v = good.to_vec();
        v.resize(n, 0);
        assert_eq!(
            Endpoint::from_bytes(&v),
            Err(EndpointError::Length {
                got: n,
                expected: 32
            })
        );
    }
    let mut b = good;
    b[0] = b'X';
    assert!(matches!(
        Endpoint::from_bytes(&b),
        Err(EndpointError::Magic(_))
    ));
    let mut b = good;
    b[4] = 1; // qpn over 24 bits
    assert!(
        matches!(Endpoint::from_bytes(&b), Err(EndpointError::Field(m)) if m.contains("qp number"))
    );
    let mut b = good;
    b[8] = 1; // psn over 24 bits
    assert!(matches!(Endpoint::from_bytes(&b), Err(EndpointError::Field(m)) if m.contains("PSN")));
    let mut b = good;
    b[14] = 0;
    assert!(
        matches!(Endpoint::from_bytes(&b), Err(EndpointError::Field(m)) if m.contains("port 0"))
    );
    for code in [0u8, 6, 255] {
        let mut b = good;
        b[15] = code;
        assert!(
            matches!(Endpoint::from_bytes(&b), Err(EndpointError::Field(m)) if m.contains("MTU"))
        );
    }
    // Any bytes: an answer, never a panic.
    let mut x: u32 = 0x1234_5678;
    for _ in 0..2000 {
        let mut b = [0u8; 32];
        for byte in &mut b {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *byte = x as u8;
        }
        b[..4].copy_from_slice(b"FIB1");
        if let Ok(e) = Endpoint::from_bytes(&b) {
            assert_eq!(e.to_bytes(), b);
        }
    }
}
