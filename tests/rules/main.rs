//! Rules files: parsing, errors, live reload and the layer they drive, and
//! their parsers on random input.

#[path = "../support/mod.rs"]
mod support;

mod files;
mod mistakes;
mod parsers;
