//! A live server fed random, truncated and forged frames: it closes the offending connection
//! and keeps serving everyone else. No panic, no hang.

use proptest::prelude::*;
use shoal_proto::frame::{Frame, HEADER_LEN, MAGIC};
use shoal_proto::msg::{Cred, Op, Request};
use shoal_testkit::Cluster;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn hello() -> Vec<u8> {
    let req = Request { cred: Cred::root(), map_version: 0, op: shoal_proto::hello::hello_op("fuzz", 0) };
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
    h[6..8].copy_from_slice(&2u16.to_le_bytes());
    h[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&h);
    cases.push(huge);
    // A valid hello followed by a well-framed body that is not a Request (checksum right).
    let junk = [0xde, 0xad, 0xbe, 0xef, 0x99];
    let mut junk_body = hello();
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[6..8].copy_from_slice(&2u16.to_le_bytes());
    h[16..20].copy_from_slice(&5u32.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..28]), &junk);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    junk_body.extend_from_slice(&h);
    junk_body.extend_from_slice(&junk);
    cases.push(junk_body);
    // A header of protocol 4 (24 bytes, no op code) instead of a hello.
    let mut old = vec![0u8; 24];
    old[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    old[16..20].copy_from_slice(&5u32.to_le_bytes());
    old.extend_from_slice(&junk);
    cases.push(old);
    for case in &cases {
        poke(&addr, case);
    }

    // Valid frames with a forged op code, flags, data checksum or header checksum, after a
    // hello or instead of it, and hellos with random version ranges and feature bits.
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(150));
    let a1 = addr.clone();
    runner
        .run(
            &(any::<u16>(), any::<u8>(), any::<u32>(), proptest::option::of(any::<u32>()), any::<bool>()),
            |(code, flags, data_crc, head_crc, with_hello)| {
                let req =
                    Request { cred: Cred::root(), map_version: 0, op: Op::GetAttr { ino: shoal_proto::ROOT_INO } };
                let mut f = Vec::new();
                Frame::request(2, &req, bytes::Bytes::from_static(b"data")).unwrap().encode_into(&mut f);
                f[5] = flags;
                f[6..8].copy_from_slice(&code.to_le_bytes());
                f[24..28].copy_from_slice(&data_crc.to_le_bytes());
                if let Some(c) = head_crc {
                    f[28..32].copy_from_slice(&c.to_le_bytes());
                }
                let mut msg = if with_hello { hello() } else { Vec::new() };
                msg.extend_from_slice(&f);
                poke(&a1, &msg);
                Ok(())
            },
        )
        .unwrap();
    runner
        .run(&(any::<u32>(), any::<u32>(), any::<u64>()), |(min_version, max_version, features)| {
            let op = Op::Hello { client: "fuzz".into(), session: 0, min_version, max_version, features, auth: None };
            let mut msg = Vec::new();
            let req = Request { cred: Cred::root(), map_version: 0, op };
            Frame::request(1, &req, bytes::Bytes::new()).unwrap().encode_into(&mut msg);
            poke(&a1, &msg);
            Ok(())
        })
        .unwrap();

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
