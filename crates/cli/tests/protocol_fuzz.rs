//! A live server fed random, truncated and forged frames: it closes the offending connection
//! and keeps serving everyone else. No panic, no hang.

mod common;
use common::Cluster;
use proptest::prelude::*;
use shoal_proto::frame::{Frame, HEADER_LEN, MAGIC};
use shoal_proto::msg::{Cred, Op, Request};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn hello() -> Vec<u8> {
    let req = Request {
        cred: Cred::root(),
        map_version: 0,
        op: Op::Hello { protocol_version: shoal_proto::PROTOCOL_VERSION, client: "fuzz".into(), session: 0 },
    };
    let mut v = Vec::new();
    Frame::request(1, &req, bytes::Bytes::new()).unwrap().encode_into(&mut v);
    v
}

/// Send `bytes`, then read until the server closes or a second passes; never hangs.
fn poke(addr: &str, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 4096];
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

#[test]
fn garbage_frames_close_only_their_connection() {
    let c = Cluster::start(1);
    let addr = c.addr(0);
    let mut cases: Vec<Vec<u8>> =
        vec![vec![], b"GET / HTTP/1.1\r\n\r\n".to_vec(), vec![0xff; 100], hello()[..10].to_vec()];
    // A valid hello followed by a frame claiming a 4 GiB body.
    let mut huge = hello();
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&h);
    cases.push(huge);
    // A valid hello followed by a well-framed body that is not a Request.
    let mut junk_body = hello();
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[16..20].copy_from_slice(&5u32.to_le_bytes());
    junk_body.extend_from_slice(&h);
    junk_body.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0x99]);
    cases.push(junk_body);
    for case in &cases {
        poke(&addr, case);
    }

    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(300));
    let a2 = addr.clone();
    runner
        .run(
            &(proptest::collection::vec(any::<u8>(), 0..300), any::<bool>(), 0usize..200),
            |(bytes, with_hello, cut)| {
                let mut msg = if with_hello { hello() } else { Vec::new() };
                msg.extend_from_slice(&bytes);
                let cut = cut.min(msg.len());
                poke(&a2, &msg[..msg.len() - cut]);
                Ok(())
            },
        )
        .unwrap();

    // Still serving, and still alive as a process.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fs = c.client();
        fs.mkdir("/alive", 0o755).await.unwrap();
        assert!(fs.stat("/alive").await.is_ok());
    });
    assert!(!c.log(0).contains("panicked"), "server log shows a panic:\n{}", c.log(0));
}
