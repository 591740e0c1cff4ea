//! Generate `shoal.h` from the `extern "C"` items (cbindgen) and a pkg-config file, into
//! `<target>/<profile>/include/shoal.h` and `<target>/<profile>/shoal.pc`, beside
//! `libshoal.so` and `libshoal.a` (docs/c-api.md, "Building against it").

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
        .expect("generate shoal.h")
        .write_to_file(include.join("shoal.h"));
    let pc = format!(
        "prefix={dir}\nlibdir=${{prefix}}\nincludedir=${{prefix}}/include\n\n\
         Name: shoal\nDescription: Shoal's native client for C\nVersion: {version}\n\
         Libs: -L${{libdir}} -lshoal\nLibs.private: -lpthread -ldl -lm\nCflags: -I${{includedir}}\n",
        dir = profile_dir.display(),
        version = std::env::var("CARGO_PKG_VERSION").unwrap(),
    );
    std::fs::write(profile_dir.join("shoal.pc"), pc).expect("write shoal.pc");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
}
