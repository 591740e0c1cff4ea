//! How a mount presents itself: who may use it, what `statfs` (`df`) reports, and how it
//! answers requests it does not implement.

use shoal_testkit::mount::{cstr, sh, sh_as, skip_without_fuse, Mount, NOBODY};
use shoal_testkit::Cluster;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_mount_by_root_is_usable_by_every_user_unless_made_private() {
    if skip_without_fuse() {
        return;
    }
    if !is_root() {
        eprintln!("SKIPPED: needs root (the default depends on who mounts)");
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::with_args(&c, &[]);
    fs::write(m.p("public.txt"), b"for everyone\n").unwrap();
    fs::set_permissions(m.p("public.txt"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::create_dir(m.p("rootonly")).unwrap();
    fs::set_permissions(m.p("rootonly"), fs::Permissions::from_mode(0o700)).unwrap();
    let mp = m.path.to_string_lossy().into_owned();
    let out = sh_as(NOBODY, m.dir.path(), &format!("ls {mp} && cat {mp}/public.txt"));
    assert!(out.status.success(), "another user lists and reads: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("public.txt") && text.contains("for everyone"), "{text}");
    // Permissions are still enforced for that user.
    let out = sh_as(NOBODY, m.dir.path(), &format!("touch {mp}/mine"));
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
    let out = sh_as(NOBODY, m.dir.path(), &format!("ls {mp}/rootonly"));
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
    drop(m);

    // Private on request: only the user who mounted gets in.
    for args in [&["-o", "noallow_other"][..], &["--private"][..]] {
        let m = Mount::with_args(&c, args);
        let mp = m.path.to_string_lossy().into_owned();
        assert!(sh(&m.path, "cat public.txt").contains("for everyone"), "the owner still uses it");
        let out = sh_as(NOBODY, m.dir.path(), &format!("ls {mp}"));
        assert!(
            !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
            "{args:?}: {out:?}"
        );
    }
}

#[test]
fn statfs_block_counts_give_the_capacity_whichever_block_size_is_used() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    let fs_client = shoal_client::BlockingClient::from_config(&c.config, c.options()).unwrap();
    let capacity = fs_client.statfs().unwrap().capacity_bytes;
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and a statfs to fill.
    assert_eq!(unsafe { libc::statfs(cstr(&m.path).as_ptr(), &mut s) }, 0);
    let (bsize, frsize, blocks) = (s.f_bsize as u64, s.f_frsize as u64, s.f_blocks);
    // IOR and mdtest multiply by f_bsize, df by f_frsize: both must give the capacity.
    assert_eq!(blocks * bsize, blocks * frsize, "f_bsize {bsize} and f_frsize {frsize} must agree");
    assert!(capacity - blocks * frsize < frsize, "{blocks} blocks of {frsize} for a capacity of {capacity}");
    let df = sh(&m.path, "df -B1 --output=size . | tail -1");
    assert_eq!(df.trim().parse::<u64>().unwrap(), blocks * frsize, "df");
    let st = sh(&m.path, "stat -f -c '%b %S %s' .");
    assert_eq!(st.trim(), format!("{blocks} {frsize} {bsize}"), "stat -f");
}

#[test]
fn an_ioctl_the_mount_does_not_implement_is_enotty_and_not_logged() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(1);
    let m = Mount::new(&c, &[]);
    fs::write(m.p("f"), b"data").unwrap();
    for _ in 0..20 {
        let f = fs::File::open(m.p("f")).unwrap();
        // What isatty() does: the terminal ioctl, which a regular file answers ENOTTY.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: an open descriptor and a termios to fill.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TCGETS, &mut t) };
        assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::ENOTTY)));
        // SAFETY: an open descriptor.
        assert_eq!(unsafe { libc::isatty(f.as_raw_fd()) }, 0);
    }
    // Python's open() asks isatty() of every file it opens.
    if let Ok(out) = std::process::Command::new("python3")
        .args(["-c", "import sys; [open(sys.argv[1]).read() for _ in range(5)]"])
        .arg(m.p("f"))
        .output()
    {
        assert!(out.status.success(), "{out:?}");
    }
    assert_eq!(fs::read(m.p("f")).unwrap(), b"data", "the mount still works");
    let log = m.log_text();
    assert!(!log.to_lowercase().contains("ioctl"), "no ioctl warnings in the mount's log:\n{log}");
}
