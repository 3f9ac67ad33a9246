# The router's image: `docker build -t hiveroute .` then
#   docker run --rm -p 8080:8080 hiveroute --engine http://HOST:8000,events=tcp://HOST:5557
# Arguments go to `hiveroute serve`; every setting is also a HIVEROUTE_* variable.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY hiveroute ./hiveroute
RUN pip install --no-cache-dir --root-user-action=ignore --prefix=/install ".[redis,k8s,otel]"

FROM python:3.11-slim
RUN groupadd --system --gid 10001 hiveroute \
 && useradd --system --uid 10001 --gid hiveroute --home-dir /home/hiveroute --create-home hiveroute
COPY --from=build /install /usr/local
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HIVEROUTE_HOST=0.0.0.0 \
    HIVEROUTE_PORT=8080
USER 10001:10001
WORKDIR /home/hiveroute
EXPOSE 8080
ENTRYPOINT ["hiveroute", "serve"]
