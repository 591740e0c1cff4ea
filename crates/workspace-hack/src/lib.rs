//! Intentionally empty: this package exists for its dependency list (Cargo.toml), which makes
//! every workspace member resolve third-party features as the whole workspace does
//! (.config/hakari.toml).
