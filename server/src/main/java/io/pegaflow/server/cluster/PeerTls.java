package io.pegaflow.server.cluster;

import io.pegaflow.engine.InvalidArgumentException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;
import java.util.Collection;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * Mutual TLS between hosts from PEM files ({@code --peer-tls-cert}, {@code --peer-tls-key},
 * {@code --peer-tls-ca}): this host's certificate chain and PKCS#8 key, and the CA every peer's
 * certificate must chain to. Both ends present and check certificates (TLS 1.3).
 */
public record PeerTls(SSLContext context) {
    public static PeerTls load(Path cert, Path key, Path ca) {
        if (cert == null || key == null || ca == null) {
            throw new InvalidArgumentException("peer TLS needs --peer-tls-cert, --peer-tls-key and --peer-tls-ca; got cert="
                    + cert + " key=" + key + " ca=" + ca);
        }
        try {
            CertificateFactory x509 = CertificateFactory.getInstance("X.509");
            Collection<? extends Certificate> chain;
            try (InputStream in = Files.newInputStream(cert)) {
                chain = x509.generateCertificates(in);
            }
            Collection<? extends Certificate> cas;
            try (InputStream in = Files.newInputStream(ca)) {
                cas = x509.generateCertificates(in);
            }
            if (chain.isEmpty() || cas.isEmpty()) {
                throw new InvalidArgumentException("--peer-tls-cert " + cert + " or --peer-tls-ca " + ca + " holds no PEM certificate");
            }
            PrivateKey pk = privateKey(key);
            char[] none = new char[0];
            KeyStore ks = KeyStore.getInstance("PKCS12");
            ks.load(null, null);
            ks.setKeyEntry("host", pk, none, chain.toArray(Certificate[]::new));
            KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
            kmf.init(ks, none);
            KeyStore ts = KeyStore.getInstance("PKCS12");
            ts.load(null, null);
            int i = 0;
            for (Certificate c : cas) {
                ts.setCertificateEntry("ca" + i++, c);
            }
            TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            tmf.init(ts);
            SSLContext ctx = SSLContext.getInstance("TLSv1.3");
            ctx.init(kmf.getKeyManagers(), tmf.getTrustManagers(), null);
            return new PeerTls(ctx);
        } catch (IOException | GeneralSecurityException e) {
            throw new InvalidArgumentException("peer TLS files cert=" + cert + " key=" + key + " ca=" + ca + ": " + e.getMessage()
                    + "; expected PEM certificates and a PEM PKCS#8 private key");
        }
    }

    private static PrivateKey privateKey(Path file) throws IOException, GeneralSecurityException {
        String pem = Files.readString(file, StandardCharsets.US_ASCII);
        int begin = pem.indexOf("-----BEGIN PRIVATE KEY-----");
        int end = pem.indexOf("-----END PRIVATE KEY-----");
        if (begin < 0 || end < begin) {
            throw new InvalidArgumentException("--peer-tls-key " + file + " is not a PEM PKCS#8 key (BEGIN PRIVATE KEY); "
                    + "convert with: openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8");
        }
        byte[] der = Base64.getMimeDecoder().decode(pem.substring(begin + 27, end));
        PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(der);
        for (String alg : new String[] {"EC", "RSA", "Ed25519"}) {
            try {
                return KeyFactory.getInstance(alg).generatePrivate(spec);
            } catch (GeneralSecurityException ignored) {
                // next algorithm
            }
        }
        throw new InvalidArgumentException("--peer-tls-key " + file + ": not an EC, RSA or Ed25519 key");
    }
}
