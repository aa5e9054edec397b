-- Large values (documents, images, base64) that snapshot heads refer to by digest (R20).
CREATE TABLE blobs (
    digest     TEXT PRIMARY KEY,
    data       BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
