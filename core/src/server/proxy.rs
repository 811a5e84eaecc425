//! Sending one HTTP request over a byte stream already open (a TCP connection to another node,
//! a tunnel to a port inside a machine) and streaming its answer back; a WebSocket (any `101
//! Switching Protocols`) is then spliced, its bytes copied both ways until either side closes.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// Sends `request` over `io` as HTTP/1.1 and gives the answer, its body streamed. `Err` says
/// why there is none.
pub(crate) async fn proxy_over<I>(io: I, mut request: Request) -> Result<Response, String>
where
    I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    // Header names go in title case (`Content-Type`), as E2B's proxy and Go's HTTP stack send
    // them: HTTP says case does not matter, and some applications read them as if it did.
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("cannot speak HTTP to it: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!("a proxied connection ended: {e}");
        }
    });
    let upgrading = request
        .headers()
        .contains_key(header::UPGRADE)
        .then(|| hyper::upgrade::on(&mut request));
    let mut response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("the request failed: {e}"))?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_side) = upgrading
    {
        let server_side = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            match (client_side.await, server_side.await) {
                (Ok(client), Ok(server)) => {
                    let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
                    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut server).await {
                        tracing::debug!("a proxied WebSocket ended: {e}");
                    }
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::debug!("a proxied WebSocket did not open: {e}");
                }
            }
        });
    }
    Ok(response.map(Body::new))
}
