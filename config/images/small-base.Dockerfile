# The small runtime bases of the four images (scripts/small-base-image.sh builds them, offline, from
# the local Debian bookworm root of scripts/base-image.sh): what distroless/cc holds, no package
# manager, no shell.
#   small        glibc (libc, libm, the loader), libgcc_s, the CA bundle, /etc/passwd with the
#                nonroot user 65532, /tmp: enough for the Rust binaries (operator, fake coderd,
#                stub daemon); ldd on them lists exactly these libraries.
#   small-shell  small plus bash (and /bin/sh → bash): the suite's image, whose tutorial steps run
#                `bash -c` with kubectl.
# The legacy builder reads it (no BuildKit syntax).
ARG FROM_IMAGE
FROM ${FROM_IMAGE} AS root
RUN set -eu; \
    mkdir -p /small/tmp /small/etc/ssl/certs /shell/bin; chmod 1777 /small/tmp; \
    libs="$(dpkg -L libc6 libgcc-s1 | grep -E '/(libc\.so\.6|libm\.so\.6|libgcc_s\.so\.1|ld-linux-[^/]*\.so\.2)$')"; \
    for lib in $libs; do cp -L --parents "$lib" /small/; done; \
    cp /etc/ssl/certs/ca-certificates.crt /small/etc/ssl/certs/; \
    cp /etc/nsswitch.conf /small/etc/; \
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > /small/etc/passwd; \
    printf 'root:x:0:\nnonroot:x:65532:\n' > /small/etc/group; \
    cp /bin/bash /shell/bin/bash; ln -s bash /shell/bin/sh; \
    for lib in $(ldd /bin/bash | awk '$2 == "=>" {print $3}' | grep -v -E '/(libc\.so\.6)$'); do cp -L --parents "$lib" /shell/; done

FROM scratch AS small
COPY --from=root /small/ /
ENV PATH=/usr/local/bin:/usr/bin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

FROM small AS small-shell
COPY --from=root /shell/ /
