//! `s3-loopback ROOT ADDR`: serves ROOT (each sub-folder a bucket) as S3 on ADDR until killed, printing
//! `listening on http://ADDR` once it accepts connections (benches run it inside a network namespace).

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, addr] = &args[..] else {
        eprintln!("usage: s3-loopback ROOT ADDR   (e.g. s3-loopback /data 10.0.0.2:9000)");
        return std::process::ExitCode::from(2);
    };
    let addr = match addr.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("s3-loopback: {addr:?} is not an address such as 127.0.0.1:9000: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match s3_loopback::Server::start(std::path::Path::new(root), addr) {
        Ok(server) => {
            println!("listening on {}", server.endpoint());
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("s3-loopback: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
