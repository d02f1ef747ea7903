"""videos that start from an image: its URI, its SHA-256 at submit, and how it is fitted to the video

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('videos') as batch:
        batch.add_column(sa.Column('image_uri', sa.Text(), nullable=True))
        batch.add_column(sa.Column('image_sha256', sa.String(length=64), nullable=True))
        batch.add_column(sa.Column('image_fit', sa.String(length=8), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('videos') as batch:
        batch.drop_column('image_fit')
        batch.drop_column('image_sha256')
        batch.drop_column('image_uri')
