"""per-video stage seconds: text encoding, denoising, decoding

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('videos') as batch:
        batch.add_column(sa.Column('text_s', sa.Float(), nullable=True))
        batch.add_column(sa.Column('denoise_s', sa.Float(), nullable=True))
        batch.add_column(sa.Column('decode_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('videos') as batch:
        batch.drop_column('decode_s')
        batch.drop_column('denoise_s')
        batch.drop_column('text_s')
