# One raftsched node per container. Configure it with flags (see `raftsched node
# --help`), the Raft secret in RAFTSCHED_RAFT_SECRET and the bootstrap admin
# token in RAFTSCHED_ADMIN_TOKEN (the same on every node), e.g.:
#   docker run -e RAFTSCHED_RAFT_SECRET=... -e RAFTSCHED_ADMIN_TOKEN=... \
#     -v /srv/n1:/data -p 8701:8701 -p 9701:9701 \
#     raftsched --id n1 --http 0.0.0.0:8701 --raft n1.example:9701 \
#     --peers n2.example:9701,n3.example:9701 --advertise-http http://n1.example:8701
# compose.yaml runs three such nodes on one host (docs/operations.md).
FROM python:3.11-slim

RUN useradd --system --home-dir /data --create-home raftsched
WORKDIR /src
COPY pyproject.toml README.md ./
COPY raftsched ./raftsched
RUN pip install --no-cache-dir . && rm -rf /src

USER raftsched
VOLUME /data
EXPOSE 8701 9701
ENTRYPOINT ["raftsched", "node", "--data", "/data"]
