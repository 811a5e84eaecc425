//! The shortest useful evervm program: an in-process engine, one machine, state kept between
//! instructions, output streamed.
//!
//! `cargo run -p evervm-examples --bin quickstart`
#![allow(clippy::print_stdout)]

use evervm::{Client, CreateMachineOptions, LocalOptions};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let home = tempfile::tempdir()?;
    let client = Client::local(LocalOptions {
        home: Some(home.path().to_owned()),
        ..LocalOptions::default()
    })
    .await?;
    let machine = client
        .create_machine(CreateMachineOptions::default())
        .await?;
    machine.exec("import math\nradius = 2").await?;
    let run = machine
        .exec("print('area of a circle of radius', radius)\nmath.pi * radius ** 2")
        .await?;
    print!("{}", run.stdout());
    println!("value: {}", run.result.value.unwrap_or_default());
    Ok(())
}
