//! Generate `shoal_container.h` from the `extern "C"` items (cbindgen), copy the
//! header-only MPI adapter `shoal_container_mpi.h` beside it, and write a pkg-config file:
//! `<target>/<profile>/include/shoal_container.h`, `.../include/shoal_container_mpi.h` and
//! `<target>/<profile>/shoal_container.pc`, beside `libshoal_container.so` and `.a` (as
//! crates/capi does for libshoal; docs/containers-c.md, "Building against it").

use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    // OUT_DIR is <target>/<profile>/build/<crate>-<hash>/out: the profile directory, where
    // cargo puts the libraries, is three levels up.
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let profile_dir = out.ancestors().nth(3).expect("OUT_DIR inside the target directory").to_path_buf();
    let include = profile_dir.join("include");
    std::fs::create_dir_all(&include).expect("create the include directory");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("generate shoal_container.h")
        .write_to_file(include.join("shoal_container.h"));
    // Compiled by the user's mpicc, never by this crate: the library does not link MPI.
    std::fs::copy(crate_dir.join("include/shoal_container_mpi.h"), include.join("shoal_container_mpi.h"))
        .expect("copy shoal_container_mpi.h");
    let pc = format!(
        "prefix={dir}\nlibdir=${{prefix}}\nincludedir=${{prefix}}/include\n\n\
         Name: shoal_container\nDescription: Shoal's task-local I/O containers for C\nVersion: {version}\n\
         Libs: -L${{libdir}} -lshoal_container\nLibs.private: -lpthread -ldl -lm\nCflags: -I${{includedir}}\n",
        dir = profile_dir.display(),
        version = std::env::var("CARGO_PKG_VERSION").unwrap(),
    );
    std::fs::write(profile_dir.join("shoal_container.pc"), pc).expect("write shoal_container.pc");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=include");
    println!("cargo:rerun-if-changed=cbindgen.toml");
}
