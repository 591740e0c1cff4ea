//! The HTTP file API (docs/http.md) against real clusters with the real `curl`: GET, HEAD,
//! ranges, validators, listings, PUT (small, huge, into a striped directory), DELETE, and
//! who may do what (anonymous, tokens from `shoal token`, POSIX permissions).

use shoal_client::{Client, LayoutSpec, OpenFlags};
use shoal_testkit::{pattern, Cluster};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// A curl answer: status, headers (lower-case names; the last of each) and body.
struct Answer {
    status: u16,
    headers: HashMap<String, String>,
    /// The header block as received.
    raw_headers: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(String::as_str).unwrap_or("")
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Run curl with `args` on `url`; the body goes to a file next to the header dump.
fn curl(dir: &Path, url: &str, args: &[&str]) -> Answer {
    let (hfile, bfile) = (dir.join("curl.headers"), dir.join("curl.body"));
    // curl writes no body file for an empty body: what an earlier call left must not count.
    let _ = std::fs::remove_file(&bfile);
    let out = Command::new("curl")
        .args(["-sS", "--path-as-is", "-D"])
        .arg(&hfile)
        .arg("-o")
        .arg(&bfile)
        .args(["-w", "%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl");
    assert!(out.status.success(), "curl {url} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let status = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let mut headers = HashMap::new();
    let raw_headers = std::fs::read_to_string(&hfile).unwrap();
    for line in raw_headers.lines() {
        if let Some((k, v)) = line.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let body = std::fs::read(&bfile).unwrap_or_default();
    Answer { status, headers, raw_headers, body }
}

fn token(c: &Cluster, args: &[&str]) -> String {
    let mut all = vec!["token"];
    all.extend_from_slice(args);
    let (code, out, err) = c.shoal(&all);
    assert_eq!(code, 0, "shoal token: {err}");
    out.trim().to_string()
}

async fn write_file(client: &Client, path: &str, data: &[u8]) {
    let f = client.create(path, 0o644, None).await.unwrap();
    f.write_at(0, data).await.unwrap();
    f.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_head_ranges_validators_and_listings() {
    let c = Cluster::start(4);
    let client = c.client();
    let tmp = c.path().join("scratch");
    std::fs::create_dir(&tmp).unwrap();
    let size = 5 << 20;
    let data = pattern(7, 0, size);
    client.mkdir("/d", 0o755).await.unwrap();
    let spec = LayoutSpec { stripe_size: Some(256 << 10), stripe_count: Some(4), ..Default::default() };
    let f = client.create("/d/data.bin", 0o644, Some(spec)).await.unwrap();
    f.write_at(0, &data).await.unwrap();
    f.close().await.unwrap();
    write_file(&client, "/d/small name.txt", b"hello").await;
    client.mkdir("/d/sub", 0o755).await.unwrap();
    let url = format!("{}/fs/d/data.bin", c.http_url(2));

    // Whole file, byte-exact, from a server that holds only a quarter of it.
    let a = curl(&tmp, &url, &[]);
    assert_eq!(a.status, 200);
    assert!(a.body == data, "GET differs from the file");
    assert_eq!(a.header("accept-ranges"), "bytes");
    let etag = a.header("etag").to_string();
    let last_modified = a.header("last-modified").to_string();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");

    // HEAD: the same headers, no body (curl -I writes the headers where the body would go).
    let h = curl(&tmp, &url, &["-I"]);
    assert_eq!((h.status, h.header("content-length"), h.header("etag")), (200, &*size.to_string(), &*etag));
    assert_eq!(h.body, h.raw_headers.as_bytes());

    // Single, suffix and open ranges.
    let r = curl(&tmp, &url, &["-r", "1000-1999"]);
    assert_eq!((r.status, r.header("content-range")), (206, &*format!("bytes 1000-1999/{size}")));
    assert!(r.body == data[1000..2000]);
    let r = curl(&tmp, &url, &["-H", "Range: bytes=-500"]);
    assert_eq!(r.status, 206);
    assert!(r.body == data[size - 500..]);
    let r = curl(&tmp, &url, &["-r", "4000000-"]);
    assert_eq!(r.status, 206);
    assert!(r.body == data[4_000_000..]);

    // Several ranges: multipart/byteranges with each part's Content-Range and bytes.
    let r = curl(&tmp, &url, &["-r", "0-9,3000000-3000099"]);
    assert_eq!(r.status, 206);
    let ctype = r.header("content-type");
    let boundary = ctype.strip_prefix("multipart/byteranges; boundary=").expect(ctype).to_string();
    let body = &r.body;
    let part = |range: &str, bytes: &[u8]| {
        let head = format!("Content-Range: bytes {range}/{size}\r\n\r\n");
        let at = body.windows(head.len()).position(|w| w == head.as_bytes()).expect(&head) + head.len();
        assert!(&body[at..at + bytes.len()] == bytes, "part {range}");
    };
    part("0-9", &data[..10]);
    part("3000000-3000099", &data[3_000_000..3_000_100]);
    assert!(body.ends_with(format!("--{boundary}--\r\n").as_bytes()));
    assert_eq!(r.header("content-length"), body.len().to_string());

    // A malformed Range is ignored (whole file); one beyond the end is 416.
    let r = curl(&tmp, &url, &["-H", "Range: bytes=500-100"]);
    assert_eq!((r.status, r.body.len()), (200, size));
    let r = curl(&tmp, &url, &["-r", &format!("{size}-")]);
    assert_eq!((r.status, r.header("content-range")), (416, &*format!("bytes */{size}")));
    assert!(r.text().starts_with("416 Range Not Satisfiable: ") && r.text().ends_with('\n'), "{}", r.text());

    // Validators: 304 for a matching tag or an unchanged date; If-Range with another tag
    // sends the whole file.
    let r = curl(&tmp, &url, &["-H", &format!("If-None-Match: {etag}")]);
    assert_eq!((r.status, r.body.len()), (304, 0));
    let r = curl(&tmp, &url, &["-H", &format!("If-Modified-Since: {last_modified}")]);
    assert_eq!(r.status, 304);
    let r = curl(&tmp, &url, &["-r", "0-9", "-H", "If-Range: \"other\""]);
    assert_eq!((r.status, r.body.len()), (200, size));
    let r = curl(&tmp, &url, &["-r", "0-9", "-H", &format!("If-Range: {etag}")]);
    assert_eq!((r.status, r.body.len()), (206, 10));
    // A write changes the tag.
    let f = client.open("/d/data.bin", OpenFlags { write: true, ..Default::default() }).await.unwrap();
    f.write_at(0, b"X").await.unwrap();
    f.close().await.unwrap();
    let r = curl(&tmp, &url, &["-H", &format!("If-None-Match: {etag}"), "-r", "0-0"]);
    assert_eq!((r.status, &r.body[..]), (206, &b"X"[..]));

    // Listings: a directory without its slash redirects; HTML for browsers, JSON for programs.
    let r = curl(&tmp, &format!("{}/fs/d", c.http_url(1)), &[]);
    assert_eq!((r.status, r.header("location")), (301, "/fs/d/"));
    let r = curl(&tmp, &format!("{}/fs/d/", c.http_url(1)), &["-H", "Accept: text/html"]);
    assert_eq!(r.status, 200);
    let page = r.text();
    assert!(page.contains("<a href=\"data.bin\">data.bin</a>"), "{page}");
    assert!(page.contains("<a href=\"small%20name.txt\">small name.txt</a>"), "{page}");
    assert!(page.contains("<a href=\"sub/\">sub/</a>"), "{page}");
    assert!(
        page.find("data.bin").unwrap() < page.find("small").unwrap()
            && page.find("small").unwrap() < page.find("sub/").unwrap()
    );
    let r = curl(&tmp, &format!("{}/fs/d/?format=json", c.http_url(3)), &[]);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let names: Vec<(&str, &str, u64)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap(), e["size"].as_u64().unwrap()))
        .collect();
    assert_eq!(names[..2], [("data.bin", "file", size as u64), ("small name.txt", "file", 5)]);
    assert_eq!((names[2].0, names[2].1), ("sub", "dir"));
    let r = curl(&tmp, &format!("{}/fs/", c.http_url(0)), &["-H", "Accept: application/json"]);
    assert_eq!(r.header("content-type"), "application/json");

    // Missing paths, bad paths, other methods.
    let r = curl(&tmp, &format!("{}/fs/d/nope", c.http_url(0)), &[]);
    assert_eq!(r.status, 404);
    assert!(r.text().starts_with("404 Not Found: ") && r.text().lines().count() == 1, "{}", r.text());
    for bad in ["/fs/d/../etc", "/fs/d/%2e%2e/x", "/fs/a%00b", "/fs/a%2Fb", "/fs/%FF"] {
        let r = curl(&tmp, &format!("{}{bad}", c.http_url(0)), &[]);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }
    let r = curl(&tmp, &url, &["-X", "POST"]);
    assert_eq!((r.status, r.header("allow")), (405, "GET, HEAD, PUT, DELETE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_delete_and_who_may_do_what() {
    let c = Cluster::start(4);
    let client = c.client();
    let tmp = c.path().join("scratch");
    std::fs::create_dir(&tmp).unwrap();
    let root = token(&c, &["--uid", "0", "--gid", "0"]);
    let auth = format!("Authorization: Bearer {root}");
    let base = c.http_url(1);
    let src = tmp.join("src.bin");
    let data = pattern(3, 0, 3 << 20);
    std::fs::write(&src, &data).unwrap();
    let src = src.to_str().unwrap();

    // A directory by PUT with a trailing slash; a default layout striping over 4 servers.
    let r = curl(&tmp, &format!("{base}/fs/up/"), &["-X", "PUT", "-H", &auth]);
    assert_eq!(r.status, 201, "{}", r.text());
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(4), ..Default::default() };
    client.set_layout("/up", spec).await.unwrap();

    // A new file: 201; it takes the directory's layout; the same path again: 204.
    let r = curl(&tmp, &format!("{base}/fs/up/a.bin"), &["-T", src, "-H", &auth]);
    assert_eq!(r.status, 201, "{}", r.text());
    let f = client.open("/up/a.bin", OpenFlags::read_only()).await.unwrap();
    assert_eq!((f.layout().servers.len(), f.layout().stripe_size), (4, 64 << 10));
    assert!(f.read_at(0, data.len() + 1).await.unwrap() == data);
    let r = curl(&tmp, &format!("{base}/fs/up/a.bin"), &["-T", "/dev/null", "-H", &auth]);
    assert_eq!(r.status, 204);
    assert_eq!(c.uncached_client().stat("/up/a.bin").await.unwrap().size, 0);
    let r = curl(&tmp, &format!("{base}/fs/up/sub/"), &["-X", "PUT", "-H", &auth]);
    assert_eq!(r.status, 201);
    let r = curl(&tmp, &format!("{base}/fs/up/sub"), &["-T", src, "-H", &auth]);
    assert_eq!(r.status, 409, "a file over a directory: {}", r.text());
    let r = curl(&tmp, &format!("{base}/fs/nodir/x"), &["-T", src, "-H", &auth]);
    assert_eq!(r.status, 404);

    // DELETE: a non-empty directory is 409, a file and an empty directory 204, then 404.
    let r = curl(&tmp, &format!("{base}/fs/up"), &["-X", "DELETE", "-H", &auth]);
    assert_eq!(r.status, 409, "{}", r.text());
    let r = curl(&tmp, &format!("{base}/fs/up/a.bin"), &["-X", "DELETE", "-H", &auth]);
    assert_eq!(r.status, 204);
    let r = curl(&tmp, &format!("{base}/fs/up/sub/"), &["-X", "DELETE", "-H", &auth]);
    assert_eq!(r.status, 204);
    let r = curl(&tmp, &format!("{base}/fs/up/a.bin"), &["-X", "DELETE", "-H", &auth]);
    assert_eq!(r.status, 404);
    assert!(client.stat("/up/a.bin").await.is_err());

    // Anonymous writes: 401 with a challenge, whatever the permissions.
    let r = curl(&tmp, &format!("{base}/fs/up/anon"), &["-T", src]);
    assert_eq!((r.status, r.header("www-authenticate")), (401, "Bearer realm=\"shoal\""));
    assert!(r.text().contains("writes need a token"), "{}", r.text());
    let r = curl(&tmp, &format!("{base}/fs/up"), &["-X", "DELETE"]);
    assert_eq!(r.status, 401);

    // A user's token: POSIX permissions decide (root's 0755 directory is not theirs).
    let user = token(&c, &["--uid", "1000", "--gid", "1000"]);
    let uauth = format!("Authorization: Bearer {user}");
    let r = curl(&tmp, &format!("{base}/fs/up/u.bin"), &["-T", src, "-H", &uauth]);
    assert_eq!(r.status, 403, "{}", r.text());
    client.mkdir("/home", 0o755).await.unwrap();
    client.mkdir("/home/u", 0o755).await.unwrap();
    client.chown("/home/u", Some(1000), Some(1000)).await.unwrap();
    let r = curl(&tmp, &format!("{base}/fs/home/u/secret"), &["-T", src, "-H", &uauth]);
    assert_eq!(r.status, 201, "{}", r.text());
    let a = client.stat("/home/u/secret").await.unwrap();
    assert_eq!((a.uid, a.gid, a.size), (1000, 1000, data.len() as u64));
    client.chmod("/home/u/secret", 0o600).await.unwrap();
    let r = curl(&tmp, &format!("{}/fs/home/u/secret", c.http_url(3)), &[]);
    assert_eq!(r.status, 403, "anonymous read of a 0600 file: {}", r.text());
    let r = curl(&tmp, &format!("{}/fs/home/u/secret", c.http_url(3)), &["-H", &uauth]);
    assert_eq!(r.status, 200);
    assert!(r.body == data);

    // Tokens that are expired, forged or not tokens at all: 401 naming why.
    let short = token(&c, &["--uid", "1000", "--ttl", "1s"]);
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let r = curl(&tmp, &format!("{base}/fs/home/u/secret"), &["-H", &format!("Authorization: Bearer {short}")]);
    assert_eq!(r.status, 401);
    assert!(r.text().contains("expired"), "{}", r.text());
    let forged = user.replacen(".1000.1000.", ".0.0.", 1);
    let r = curl(&tmp, &format!("{base}/fs/home/u/x"), &["-T", src, "-H", &format!("Authorization: Bearer {forged}")]);
    assert_eq!(r.status, 401);
    assert!(r.text().contains("not valid"), "{}", r.text());
    let r = curl(&tmp, &format!("{base}/fs/"), &["-H", "Authorization: Bearer nonsense"]);
    assert!(r.status == 401 && r.text().contains("malformed"), "{}", r.text());
    let r = curl(&tmp, &format!("{base}/fs/"), &["-u", "user:pw"]);
    assert!(r.status == 401 && r.text().contains("Bearer"), "{}", r.text());

    // `shoal token` refuses what it cannot honour, in one line.
    let (code, _, err) = c.shoal(&["token", "--ttl", "0s"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = c.shoal(&["token", "--ttl", "soon"]);
    assert!(code == 2 && err.contains("not a duration"), "{err}");
    let (code, out, _) = c.shoal(&["token", "--uid", "5", "--groups", "7,8", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (code, v["uid"].as_u64(), v["gid"].as_u64(), v["groups"].clone()),
        (0, Some(5), Some(5), serde_json::json!([7, 8]))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_put_streams_in_and_reads_back_byte_for_byte_from_another_server() {
    let c = Cluster::start(4);
    let client = c.client();
    let tmp = c.path().join("scratch");
    std::fs::create_dir(&tmp).unwrap();
    client.mkdir("/big", 0o755).await.unwrap();
    client.set_layout("/big", LayoutSpec { stripe_count: Some(4), ..Default::default() }).await.unwrap();
    let size: usize = 300 << 20;
    let src = tmp.join("huge.bin");
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(std::fs::File::create(&src).unwrap());
        for off in (0..size).step_by(8 << 20) {
            w.write_all(&pattern(11, off as u64, (8 << 20).min(size - off))).unwrap();
        }
    }
    let root = token(&c, &["--uid", "0", "--gid", "0"]);
    let r = curl(
        &tmp,
        &format!("{}/fs/big/huge.bin", c.http_url(0)),
        &["-T", src.to_str().unwrap(), "-H", &format!("Authorization: Bearer {root}")],
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // Through the native client, piece by piece.
    let f = client.open("/big/huge.bin", OpenFlags::read_only()).await.unwrap();
    assert_eq!((f.attr().size, f.layout().servers.len()), (size as u64, 4));
    for off in (0..size).step_by(32 << 20) {
        let got = f.read_at(off as u64, 32 << 20).await.unwrap();
        assert!(got[..] == pattern(11, off as u64, got.len())[..], "native read at {off}");
    }
    // Through another server's HTTP port, compared with the source by cmp.
    let out = tmp.join("back.bin");
    let st = Command::new("curl")
        .args(["-sSf", "-o"])
        .arg(&out)
        .arg(format!("{}/fs/big/huge.bin", c.http_url(3)))
        .status()
        .unwrap();
    assert!(st.success());
    let same = Command::new("cmp").arg(&src).arg(&out).status().unwrap();
    assert!(same.success(), "GET from server 3 differs from what was PUT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_none_refuses_requests_without_a_token() {
    let c = Cluster::start_with(2, |m| m.http.anonymous = shoal_placement::map::AnonymousAccess::None);
    let client = c.client();
    let tmp = c.path().join("scratch");
    std::fs::create_dir(&tmp).unwrap();
    write_file(&client, "/open.txt", b"public?").await;
    let url = format!("{}/fs/open.txt", c.http_url(0));
    let r = curl(&tmp, &url, &[]);
    assert_eq!((r.status, r.header("www-authenticate")), (401, "Bearer realm=\"shoal\""));
    assert!(r.text().contains("no anonymous requests"), "{}", r.text());
    let t = token(&c, &["--uid", "1000"]);
    let r = curl(&tmp, &url, &["-H", &format!("Authorization: Bearer {t}")]);
    assert_eq!((r.status, &r.body[..]), (200, &b"public?"[..]));
}

/// `shoal bench http` (small here): the three reads are measured and their ratios reported,
/// and the test file is gone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_http_times_native_one_stream_and_parallel_ranges() {
    let c = Cluster::start(4);
    let (code, out, err) = c.shoal(&["bench", "http", "-s", "32M", "-P", "3", "--server", "1", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["size"].as_u64(), v["parallel"].as_u64(), v["server"].as_u64()), (Some(32 << 20), Some(3), Some(1)));
    for k in ["native_mib_s", "curl_mib_s", "parallel_mib_s", "curl_vs_native", "parallel_vs_curl"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    assert!(v["url"].as_str().unwrap().starts_with(&c.http_url(1)));
    assert!(c.client().stat("/shoal-bench/http.bin").await.is_err());
    let (code, _, err) = c.shoal(&["bench", "http", "--server", "9"]);
    assert!(code == 2 && err.contains("no server 9"), "{err}");
}

/// Issue 51: `[http] anonymous_uid = 0` was accepted, so anonymous HTTP readers read as
/// root. A map naming root (or a system account, below `anonymous_min_id`) is refused by the
/// servers and the CLI alike, in one line naming the field.
#[test]
fn a_map_that_makes_anonymous_readers_root_is_refused() {
    let c = Cluster::start(1);
    let text = std::fs::read_to_string(&c.config).unwrap();
    for (extra, field) in [
        ("[http]\nanonymous_uid = 0\n", "http.anonymous_uid is 0"),
        ("[http]\nanonymous_gid = 0\n", "http.anonymous_gid is 0"),
        ("[http]\nanonymous_uid = 33\n", "http.anonymous_uid 33 is below http.anonymous_min_id 1000"),
    ] {
        let bad = c.path().join("bad.toml");
        std::fs::write(&bad, format!("{text}\n{extra}")).unwrap();
        let (code, _, err) = shoal_testkit::shoal_cmd(Some(&bad), &["ls", "/"]);
        assert_eq!(code, 1, "shoal accepted {extra:?}: {err}");
        assert!(err.contains(field), "{err}");
        let scratch = tempfile::tempdir().unwrap();
        let out = Command::new(shoal_testkit::shoald_bin())
            .arg("--config")
            .arg(&bad)
            .args(["--id", "0", "--data-dir"])
            .arg(scratch.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(field), "shoald started with {extra:?}: {err}");
    }
    // A site may lower the floor knowingly, never to root.
    let ok = c.path().join("ok.toml");
    std::fs::write(&ok, format!("{text}\n[http]\nanonymous_uid = 33\nanonymous_gid = 33\nanonymous_min_id = 33\n"))
        .unwrap();
    let (code, _, err) = shoal_testkit::shoal_cmd(Some(&ok), &["ls", "/"]);
    assert_eq!(code, 0, "{err}");
}
